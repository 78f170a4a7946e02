"""snapmla as the KV cache and decode attention of Hugging Face transformers' MLA models.

    import torch, snapmla.transformers
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda")
    snapmla.transformers.prepare(model, max_tokens=8192)   # tokens per request, prompt included
    out = model.generate(input_ids, attention_mask=mask, max_new_tokens=256)

``prepare`` replaces the ``forward`` of the model's MLA attention modules (per instance; the
class and the weights are untouched) and wraps ``model.generate`` so that a call without
``past_key_values`` gets a fresh :class:`SnapMLACache` sized for its batch. The cache holds each
layer's latent ``c_kv`` [512] and rotated ``k_pe`` [64] (what the stock module hands its cache)
in snapmla's FP8 paged format: one ``snapmla.torch.empty_cache`` tensor for all layers, pages
assigned to requests once (a fixed block table), per-request lengths on the device.

A step of ``s`` new tokens per request:

* ``s <= max_decode_q_len`` (decode; 1 by default, up to 4): the new latents are appended
  (``snapmla.torch.append``), the plan is built once for all layers (``snapmla.torch.plan``),
  and each layer attends in absorbed form: ``q_nope @ W_UK`` (``kv_b_proj.weight.view(h,
  qk_nope + v, 512)[:, :qk_nope]``) is the 512-wide latent query, concatenated with the rotated
  ``q_pe`` as snapmla's 576-wide row; ``snapmla.torch.decode`` (causal among the ``s`` new
  tokens, the module's own ``scaling`` as softmax scale, yarn's mscale included) gives the
  512-wide latent output, ``W_UV`` and ``o_proj`` finish it. No host synchronization; under
  ``torch.compile`` / CUDA graphs the snapmla calls are ``torch.ops.snapmla`` custom ops.
* longer steps (prefill, chunked prefill, a new turn): the new latents are appended too, the
  cached prefix is read back with ``snapmla.torch.fetch_dequant`` (the BF16 values decode
  attends over) and the stock attention math (``expand_kv``, SDPA) runs over prefix + new
  tokens. One host synchronization per step (the longest prefix), none under compile.

Batches of different prompt lengths: transformers left-pads and passes a 2D ``attention_mask``;
``prepare`` registers the attention implementation ``"snapmla"``, whose mask is the last ``s``
columns of that mask, so padding tokens are never cached and each request's length and RoPE
positions (transformers' ``position_ids``, the mask's cumulative sum) count its own tokens.
Padding may appear only before a request's first token, as ``generate`` puts it.

Model types (transformers 5.17 to 5.25, the releases tested; every one is checked:
``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64, 1 to 128 heads):

* ``deepseek_v3`` (``DeepseekV3Attention``; RoPE interleaved or not, per
  ``config.rope_interleave``), and what embeds it: ``kimi_k25`` (its language model is a
  ``DeepseekV3Model``), ``kimi_k2`` checkpoints (model type ``deepseek_v3``);
* ``glm4_moe_lite`` (``Glm4MoeLiteAttention``, the same module);
* ``deepseek_v2`` (``DeepseekV2Attention``: complex-valued RoPE on interleaved pairs);
* ``longcat_flash`` (``LongcatFlashMLA``: two attention modules per decoder layer, cache layers
  ``2 i`` and ``2 i + 1``, and the LoRA scalings of q and of ``c_kv`` before caching).

Refused, naming the reason: ``deepseek_v32`` (sparse attention: it caches expanded keys and an
indexer), ``deepseek_v4`` and any other model without one of the modules above; beam search and
anything else that reorders, selects or repeats cache rows (``reorder_cache``,
``batch_select_indices``, ``batch_repeat_interleave``); a 4D attention mask; a cache that is
not a :class:`SnapMLACache` over a prefix. ``crop`` (assisted decoding, prompt lookup) is
supported: it removes each request's last tokens. A request that outgrows ``max_tokens`` makes
``generate`` raise (its tokens past the end are not cached).

The backend seam: every call that touches the GPU library goes through one object
(:class:`SnapMLABackend`); :class:`TorchBackend` implements the same interface in plain torch
on any device, for CPU tests and debugging: exact attention (the client's math alone), or with
``quantize=True`` snapmla's numerics contract (FP8 cache, query and probabilities, what
``snapmla.reference`` and the kernels compute).
"""

from __future__ import annotations

import struct
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = [
    "SnapMLABackend",
    "SnapMLACache",
    "SnapMLALayer",
    "TorchBackend",
    "prepare",
    "restore",
    "supported_model_types",
]

ATTN_IMPLEMENTATION = "snapmla"
PAGE_SIZE = 64  # token slots per page (snapmla.h SNAPMLA_PAGE_SIZE)
CONTENT_DIM = 512  # latent c_kv width
ROPE_DIM = 64  # k_pe width
MAX_HEADS = 128  # SNAPMLA_MAX_HEADS
MAX_Q_LEN = 4  # SNAPMLA_MAX_Q_LEN: new tokens per request in one decode call
_FP8_MAX = 448.0
_MIN_SCALE = 2.0**-32
_MIN_PROB_SCALE = 2.0**-64  # floor of a P block's scale

Tensor = torch.Tensor


def _compiling() -> bool:
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling()) if is_compiling is not None else False


# ------------------------------------------------------------------------------ backends


class SnapMLABackend:
    """The GPU library's calls, through ``snapmla.torch``: ``kernel`` ``"auto"``, ``"fast"`` or
    ``"reference"``; ``q_precision`` ``"fp8"`` (the contract's query) or ``"fp8x2"`` (the
    two-term query: about half the query's rounding error; ``"auto"`` and ``"fast"`` run it up
    to the library's limit of query rows a request, ``max_decode_q_len * num_heads``, which
    :meth:`check_decode_shape` enforces, and ``"reference"`` everywhere); ``out_dtype`` of the
    latent output (``None``: fp32 for an fp32 model, else BF16)."""

    compileable = True
    kv_dtype = torch.bfloat16
    name = "snapmla"

    def __init__(
        self,
        kernel: str = "auto",
        q_precision: str = "fp8",
        num_sm_parts: int = 0,
        out_dtype: torch.dtype | None = None,
    ) -> None:
        import snapmla.torch as smt

        if kernel not in ("auto", "fast", "reference"):
            raise ValueError(f"kernel: 'auto', 'fast' or 'reference', got {kernel!r}")
        if q_precision not in ("fp8", "fp8x2"):
            raise ValueError(f"q_precision: 'fp8' or 'fp8x2', got {q_precision!r}")
        if out_dtype not in (None, torch.bfloat16, torch.float32):
            raise ValueError(f"out_dtype: torch.bfloat16, torch.float32 or None, got {out_dtype}")
        self._smt = smt
        self.kernel = kernel
        self.q_precision = q_precision
        self.num_sm_parts = num_sm_parts
        self.out_dtype = out_dtype

    def check_decode_shape(self, num_heads: int, max_q_len: int) -> None:
        """Refuse (``ValueError``) decode steps of up to ``max_q_len`` new tokens of
        ``num_heads`` heads that this backend's kernel option cannot run with its query
        precision, as the library decides (``snapmla.decode.select_kernel``; no device)."""
        from snapmla import SnapMLAError
        from snapmla.decode import DecodeConfig, select_kernel

        def refusal(q_len: int) -> str | None:
            config = DecodeConfig(1, q_len, num_heads, 1, 0, self.q_precision)
            try:
                select_kernel(config, self.kernel, "snapmla.decode.select_kernel")
            except SnapMLAError as exc:
                if exc.argument != "kernel":
                    raise
                return str(exc)
            return None

        refused = refusal(max_q_len)
        if refused is None:
            return
        fits = [q_len for q_len in range(1, max_q_len) if refusal(q_len) is None]
        fix = f"max_decode_q_len <= {fits[-1]}, " if fits else ""
        raise ValueError(
            f"snapmla.transformers: q_precision={self.q_precision!r} with kernel="
            f"{self.kernel!r} cannot decode steps of max_decode_q_len={max_q_len} tokens of "
            f"{num_heads} heads ({refused}); pass {fix}kernel='reference' (the two-term query "
            "at any shape, several times slower) or q_precision='fp8'"
        )

    def empty_cache(self, num_layers: int, num_pages: int, device: torch.device) -> Tensor:
        return self._smt.empty_cache(num_layers, num_pages, device=device)

    def append(self, cache: Tensor, layer: int, c_kv: Tensor, k_pe: Tensor, slots: Tensor) -> None:
        self._smt.append(cache, layer, c_kv.to(self.kv_dtype), k_pe.to(self.kv_dtype), slots)

    def fetch_dequant(self, cache: Tensor, layer: int, slots: Tensor) -> tuple[Tensor, Tensor]:
        return self._smt.fetch_dequant(cache, layer, slots)

    def decode_buffers(self, batch: int, num_heads: int, max_pages: int, q_len: int,
                       device: torch.device) -> tuple[Tensor, Tensor]:  # fmt: skip
        return self._smt.decode_buffers(
            batch,
            num_heads=num_heads,
            max_pages=max_pages,
            q_len=q_len,
            num_sm_parts=self.num_sm_parts,
            device=device,
            q_precision=self.q_precision,
        )

    def plan(self, plan: Tensor, seqlens: Tensor, num_heads: int, max_pages: int,
             q_len: int) -> None:  # fmt: skip
        self._smt.plan(
            plan,
            seqlens,
            num_heads=num_heads,
            max_pages=max_pages,
            q_len=q_len,
            num_sm_parts=self.num_sm_parts,
            q_precision=self.q_precision,
        )

    def decode(self, cache: Tensor, layer: int, q: Tensor, block_table: Tensor, seqlens: Tensor,
               plan: Tensor, workspace: Tensor, softmax_scale: float) -> Tensor:  # fmt: skip
        out_dtype = self.out_dtype
        if out_dtype is None:
            out_dtype = torch.float32 if q.dtype == torch.float32 else torch.bfloat16
        out, _ = self._smt.decode(
            cache,
            layer,
            q.to(torch.bfloat16),
            block_table,
            seqlens,
            plan,
            workspace,
            softmax_scale=softmax_scale,
            causal=True,
            kernel=self.kernel,
            num_sm_parts=self.num_sm_parts,
            out_dtype=out_dtype,
            q_precision=self.q_precision,
        )
        return out


def _div(x: Tensor, c: float) -> Tensor:
    """``x / c`` rounded as IEEE division on every device (CUDA computes a tensor divided by a
    Python number as ``x * (1 / c)``, one ulp off the quotient the contract names)."""
    return x / x.new_full((), c)


def _e4m3(x: Tensor) -> Tensor:
    """fp32 to the nearest E4M3 value (round to nearest even, saturating at +-448), as fp32."""
    return x.clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn).float()


def _e4m3_round(x: Tensor) -> Tensor:
    """float64 to the nearest E4M3 value in one rounding (a float64 -> float8 cast rounds
    through fp32 first): ``snapmla.reference.e4m3_round``."""
    a = x.abs().clamp(max=_FP8_MAX)
    e = torch.floor(torch.log2(a)).clamp(min=-6)  # exponent of a, corrected below
    e = e - (torch.exp2(e) > a).to(e.dtype) + (torch.exp2(e + 1) <= a).to(e.dtype)
    quantum = torch.exp2(e.clamp(min=-6) - 3)  # 3 mantissa bits; subnormal spacing 2^-9
    return torch.copysign(torch.round(a / quantum) * quantum, x)


def _quantize_rows(nope: Tensor, pe: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``snapmla.reference.quantize_rows`` of rows taken as BF16: (E4M3 content, BF16 RoPE
    pre-divided by the scale, fp32 scale ``max(amax / 448, 2^-32)`` ``[..., 1]``), all fp32."""
    nope, pe = nope.to(torch.bfloat16).float(), pe.to(torch.bfloat16).float()
    scale = _div(nope.abs().amax(dim=-1, keepdim=True), _FP8_MAX).clamp_min(_MIN_SCALE)
    return _e4m3(nope / scale), (pe / scale).to(torch.bfloat16).float(), scale


class TorchBackend:
    """The backend contract in plain torch, on any device (CPU tests, debugging).

    ``quantize=False``: exact attention over the tokens as given, in fp32: the client's math
    alone. The cache is fp32 ``[layers, pages * 64 + 1, 577]`` (token slot ``t`` in row ``t``;
    the last row takes skipped tokens), decode is exact softmax attention over it with snapmla's
    visibility rule (token ``j < seqlen``; causal, bottom-right aligned, among the new tokens).

    ``quantize=True``: snapmla's numerics contract (``snapmla.reference``, what the kernels
    compute): the cache holds each token's E4M3 content, BF16 RoPE pre-divided by the token's
    scale and the fp32 scale ``max(amax / 448, 2^-32)`` of its BF16 ``c_kv``, bit for bit
    (``fetch_dequant`` gives ``bf16(code * scale)``); decode quantizes each (token, head) query
    row the same way (``q_precision="fp8x2"``: the two-term query), takes the logits
    ``(q8.c8 + qr.kr) * s_q * s_k * softmax_scale`` and the probabilities as E4M3 per 64-token
    block with the running-max rescaling, in float64 as ``snapmla.reference.decode_reference``
    does."""

    compileable = True
    kv_dtype = None  # keeps the model's dtype
    name = "torch"

    def __init__(self, quantize: bool = False, q_precision: str = "fp8") -> None:
        if q_precision not in ("fp8", "fp8x2"):
            raise ValueError(f"q_precision: 'fp8' or 'fp8x2', got {q_precision!r}")
        if q_precision == "fp8x2" and not quantize:
            raise ValueError("q_precision='fp8x2' needs quantize=True (exact attention has no FP8)")
        self.quantize = quantize
        self.q_precision = q_precision

    def empty_cache(self, num_layers: int, num_pages: int, device: torch.device) -> Tensor:
        rows = num_pages * PAGE_SIZE + 1
        return torch.zeros(
            (num_layers, rows, CONTENT_DIM + ROPE_DIM + 1), dtype=torch.float32, device=device
        )

    @staticmethod
    def round_trip(c_kv: Tensor, k_pe: Tensor) -> tuple[Tensor, Tensor]:
        """snapmla's quantize-then-dequantize of tokens (``snapmla.reference.quantize_kv``
        then ``dequantize``, bit for bit on any device), as BF16 ``(c_kv [n, 512], k_pe
        [n, 64])``."""
        content, rope, scale = _quantize_rows(c_kv, k_pe)
        return (content * scale).to(torch.bfloat16), (rope * scale).to(torch.bfloat16)

    def append(self, cache: Tensor, layer: int, c_kv: Tensor, k_pe: Tensor, slots: Tensor) -> None:
        if self.quantize:
            content, rope, scale = _quantize_rows(c_kv, k_pe)
            values = torch.cat([content, rope, scale], dim=-1)
        else:
            values = torch.cat([c_kv.float(), k_pe.float(), c_kv.new_ones(c_kv.shape[0], 1)], -1)
        rows = cache.shape[1] - 1
        target = torch.where((slots >= 0) & (slots < rows), slots, rows)
        cache[layer].index_copy_(0, target, values.float())

    def fetch_dequant(self, cache: Tensor, layer: int, slots: Tensor) -> tuple[Tensor, Tensor]:
        rows = cache.shape[1] - 1
        keep = (slots >= 0) & (slots < rows)
        stored = cache[layer].index_select(0, torch.where(keep, slots, rows))
        values = stored[:, :-1] * stored[:, -1:]
        if self.quantize:
            values = values.to(torch.bfloat16)  # bf16(code * scale), as snapmla's
        values = torch.where(keep[:, None], values, 0.0)  # a negative slot reads zeros
        return values[:, :CONTENT_DIM], values[:, CONTENT_DIM:]

    def decode_buffers(self, batch: int, num_heads: int, max_pages: int, q_len: int,
                       device: torch.device) -> tuple[Tensor, Tensor]:  # fmt: skip
        empty = torch.zeros(1, dtype=torch.uint8, device=device)
        return empty, empty.clone()

    def plan(self, plan: Tensor, seqlens: Tensor, num_heads: int, max_pages: int,
             q_len: int) -> None:  # fmt: skip
        pass

    def decode(self, cache: Tensor, layer: int, q: Tensor, block_table: Tensor, seqlens: Tensor,
               plan: Tensor, workspace: Tensor, softmax_scale: float) -> Tensor:  # fmt: skip
        b, s, h, _ = q.shape
        n = block_table.shape[1] * PAGE_SIZE
        j = torch.arange(n, device=q.device)
        slots = block_table[:, j // PAGE_SIZE].long() * PAGE_SIZE + j % PAGE_SIZE  # [b, n]
        kv = cache[layer].index_select(0, slots.reshape(-1)).view(b, n, -1)  # [b, n, 577]
        limit = seqlens.long()[:, None] - s + torch.arange(s, device=q.device)  # [b, s]
        visible = (j[None, None, :] < seqlens.long()[:, None, None]) & (
            j[None, None, :] <= limit[:, :, None]
        )  # [b, s, n]
        if self.quantize:
            return self._contract_decode(q, kv, visible, softmax_scale)
        kv = kv[..., :-1]
        z = torch.einsum("bshd,bnd->bshn", q.float(), kv) * softmax_scale
        z = z.masked_fill(~visible[:, :, None, :], float("-inf"))
        p = torch.softmax(z, dim=-1).nan_to_num(0.0)  # rows that see nothing: out = 0
        return torch.einsum("bshn,bnc->bshc", p, kv[..., :CONTENT_DIM])

    def _contract_decode(self, q: Tensor, kv: Tensor, visible: Tensor, softmax_scale: float
                         ) -> Tensor:  # fmt: skip
        """``snapmla.reference.decode_reference`` in torch: ``q [b, s, h, 576]``, the stored
        tokens ``kv [b, n, 577]`` in request order, ``visible [b, s, n]``; returns fp32
        ``[b, s, h, 512]``."""
        b, s, h, _ = q.shape
        n = kv.shape[1]
        qf = q.to(torch.bfloat16).float()
        q8, qr, sq = _quantize_rows(qf[..., :CONTENT_DIM], qf[..., CONTENT_DIM:])
        f64 = torch.float64
        content = kv[..., :CONTENT_DIM].to(f64)
        rope, tok_scale = kv[..., CONTENT_DIM:-1].to(f64), kv[..., -1].to(f64)
        acc = torch.einsum("bshc,bnc->bshn", q8.to(f64), content)
        acc = acc + torch.einsum("bshr,bnr->bshn", qr.to(f64), rope)
        if self.q_precision == "fp8x2":
            x = qf[..., :CONTENT_DIM] / sq  # the quotient q8 rounds, bit for bit
            q_lo = _e4m3(16.0 * (x - q8))  # exact residual, one E4M3 rounding
            rho = (sq * 2.0**-4) / sq  # fp32(s2 / s1)
            acc = acc + rho.to(f64) * torch.einsum("bshc,bnc->bshn", q_lo.to(f64), content)
        row_scale = sq.to(f64) * struct.unpack("f", struct.pack("f", softmax_scale))[0]  # fp32
        z = acc * row_scale * tok_scale[:, None, None, :]  # [b, s, h, n]
        z = z.reshape(b, s * h, n)
        vis = visible[:, :, None, :].expand(b, s, h, n).reshape(b, s * h, n)
        # NaN in a token reaches the rows that see it through z; an invisible one adds nothing.
        content = torch.where(torch.isfinite(content), content, 0.0)
        rows = (b, s * h)
        m = z.new_full(rows, float("-inf"))
        sig = z.new_ones(rows)
        l_sum = z.new_zeros(rows)
        o = z.new_zeros((*rows, CONTENT_DIM))
        seen = torch.zeros(rows, dtype=torch.bool, device=z.device)
        for j0 in range(0, n, PAGE_SIZE):
            zb, vb = z[..., j0 : j0 + PAGE_SIZE], vis[..., j0 : j0 + PAGE_SIZE]
            active = vb.any(dim=-1)
            zb = zb.masked_fill(~vb, float("-inf"))
            m_new = torch.maximum(m, zb.amax(dim=-1))
            e = torch.where(vb, torch.exp(zb - m_new[..., None]), 0.0)
            p = torch.where(vb, e * tok_scale[:, None, j0 : j0 + PAGE_SIZE], 0.0)
            sig_new = _div(p.amax(dim=-1), _FP8_MAX).clamp_min(_MIN_PROB_SCALE)
            p = _e4m3_round(p / sig_new[..., None])
            g = torch.exp(m - m_new) * sig / sig_new
            g = torch.where(torch.isneginf(m) & ~torch.isnan(m_new), 0.0, g)
            l_new = l_sum * g + e.sum(dim=-1) / sig_new
            o_new = o * g[..., None] + torch.bmm(p, content[:, j0 : j0 + PAGE_SIZE])
            m = torch.where(active, m_new, m)
            sig = torch.where(active, sig_new, sig)
            l_sum = torch.where(active, l_new, l_sum)
            o = torch.where(active[..., None], o_new, o)
            seen = seen | active
        out = torch.where(seen[..., None], o / l_sum[..., None], 0.0)
        return out.view(b, s, h, CONTENT_DIM).float()


# --------------------------------------------------------------------- model families


@dataclass(frozen=True)
class _Family:
    """How one attention class computes what it caches: its forward's positional order and a
    function giving (q_pass [b, h, s, nope], q_rot [b, h, s, 64], c_kv [b, 1, s, 512],
    k_rot [b, 1, s, 64]) exactly as the stock forward does."""

    model_types: tuple[str, ...]
    order: tuple[str, ...]  # the stock forward's parameters after hidden_states
    project: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]


def _projections(m: Any, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The new tokens' q_pass ``[b, h, s, nope]``, q_rot ``[b, h, s, rope]`` (before RoPE),
    normalized c_kv ``[b, 1, s, kv_lora_rank]`` and k_rot ``[b, 1, s, rope]`` (before RoPE)."""
    b, s = hidden.shape[:-1]
    if getattr(m, "q_lora_rank", None) is None:
        q = m.q_proj(hidden)
    else:
        q = m.q_b_proj(m.q_a_layernorm(m.q_a_proj(hidden)))
    q = q.view(b, s, -1, m.qk_head_dim).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
    kv = m.kv_a_proj_with_mqa(hidden)
    c_kv, k_rot = torch.split(kv, [m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
    c_kv = m.kv_a_layernorm(c_kv).view(b, 1, s, m.kv_lora_rank)
    return q_pass, q_rot, c_kv, k_rot.view(b, 1, s, m.qk_rope_head_dim)


def _modeling(m: Any) -> Any:
    return sys.modules[type(m).__module__]


def _project_v3(m: Any, hidden: Tensor, position_embeddings: Any) -> tuple[Tensor, ...]:
    q_pass, q_rot, c_kv, k_rot = _projections(m, hidden)
    cos, sin = position_embeddings
    mod = _modeling(m)
    if m.config.rope_interleave:
        q_rot, k_rot = mod.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    else:
        q_rot, k_rot = mod.apply_rotary_pos_emb(q_rot, k_rot, cos, sin)
    return q_pass, q_rot, c_kv, k_rot


def _project_v2(m: Any, hidden: Tensor, position_embeddings: Any) -> tuple[Tensor, ...]:
    q_pass, q_rot, c_kv, k_rot = _projections(m, hidden)
    q_rot, k_rot = _modeling(m).apply_rotary_emb(
        q_rot, k_rot, position_embeddings.to(q_rot.device)
    )
    return q_pass, q_rot, c_kv, k_rot


def _project_longcat(m: Any, hidden: Tensor, position_embeddings: Any) -> tuple[Tensor, ...]:
    q_pass, q_rot, c_kv, k_rot = _projections(m, hidden)
    q_pass = q_pass * m.mla_scale_q_lora
    q_rot = q_rot * m.mla_scale_q_lora
    c_kv = c_kv * m.mla_scale_kv_lora
    cos, sin = position_embeddings
    q_rot, k_rot = _modeling(m).apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    return q_pass, q_rot, c_kv, k_rot


_V3_ORDER = ("position_embeddings", "attention_mask", "past_key_values")
_FAMILIES: dict[str, _Family] = {
    "DeepseekV3Attention": _Family(("deepseek_v3", "kimi_k25"), _V3_ORDER, _project_v3),
    "Glm4MoeLiteAttention": _Family(("glm4_moe_lite",), _V3_ORDER, _project_v3),
    "DeepseekV2Attention": _Family(
        ("deepseek_v2",), ("attention_mask", "past_key_values", "position_embeddings"), _project_v2
    ),
    "LongcatFlashMLA": _Family(("longcat_flash",), _V3_ORDER, _project_longcat),
}
# MLA attention classes read and refused, with the reason.
_REFUSED = {
    "DeepseekV32Attention": "DeepSeek-V3.2 sparse attention caches expanded keys and an indexer "
    "key per token, not the 576-wide latent snapmla stores",
}


def supported_model_types() -> tuple[str, ...]:
    """The transformers model types whose attention modules :func:`prepare` patches."""
    return tuple(sorted({t for f in _FAMILIES.values() for t in f.model_types}))


# ---------------------------------------------------------------------- step bookkeeping


@dataclass
class _Step:
    """What every layer of one forward step shares (made by the first attention layer)."""

    q_len: int
    slots: Tensor  # int64 [b * s]: the new tokens' slots, -1 for padding
    decode: bool  # snapmla decode (s <= max_decode_q_len), else the prefill path
    valid: Tensor | None = None  # bool [b, s] (prefill): which new tokens are real
    old_lens: Tensor | None = None  # int32 [b] (prefill): lengths before the step
    prefix: int = 0  # (prefill) prefix tokens to read back, an upper bound
    dense: bool = False  # (prefill) no prefix and no padding: plain causal attention


class SnapMLALayer(CacheLayerMixin):
    """One model layer's view of a :class:`SnapMLACache`: ``update`` appends the step's new
    latents into layer ``layer`` of the shared FP8 cache."""

    is_sliding = False
    is_croppable = True
    supports_early_init = True

    def __init__(self, owner: "SnapMLACache", layer: int) -> None:
        super().__init__()
        self.owner = owner
        self.layer = layer
        self.is_compileable = owner.backend.compileable

    @property
    def is_initialized(self) -> bool:  # type: ignore[override]
        return self.owner.kv is not None

    @is_initialized.setter
    def is_initialized(self, value: bool) -> None:
        pass  # the owner's allocation decides

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.owner._allocate(key_states.shape[0], key_states.device)

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> Any:
        """Append the step's ``c_kv`` (``key_states`` ``[b, 1, s, 512]``) and ``k_pe``
        (``value_states`` ``[b, 1, s, 64]``) at the slots the step's first layer computed."""
        owner = self.owner
        step = owner._step
        if step is None:
            raise RuntimeError("SnapMLALayer.update: no step begun (SnapMLACache.begin_step)")
        owner.backend.append(
            owner.kv,
            self.layer,
            key_states.reshape(-1, key_states.shape[-1]),
            value_states.reshape(-1, value_states.shape[-1]),
            step.slots,
        )
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0

    def get_seq_length(self) -> Any:
        return self.owner.get_seq_length()

    def get_max_length(self) -> int:
        return self.owner.capacity

    def reset(self) -> None:
        self.owner.reset()

    def reorder_cache(self, beam_idx: Tensor) -> None:
        self.owner.reorder_cache(beam_idx)

    def offload(self) -> None:
        raise NotImplementedError("SnapMLACache: offloading is not supported")

    def prefetch(self) -> None:
        pass


class SnapMLACache(Cache):
    """snapmla's FP8 paged MLA cache for a model :func:`prepare` patched.

    ``max_tokens``: tokens per request (prompt and generated, padding excluded), rounded up to
    whole 64-token pages; ``batch_size``: allocate now (else at the first step, from its batch);
    ``backend`` and ``max_decode_q_len``: the model's from :func:`prepare` unless given.

    Device state: ``kv`` (the backend's cache tensor, every layer), ``block_table`` (int32
    ``[batch, pages per request]``: request ``r`` owns pages ``r * P .. r * P + P - 1``),
    ``seqlens`` (int32 ``[batch]``: tokens cached per request), ``columns`` (int64: mask
    columns consumed, what ``get_seq_length`` reports to ``generate``), ``overflow`` (bool:
    some request outgrew ``max_tokens``; :meth:`check` raises).
    """

    def __init__(
        self,
        model: Any,
        *,
        max_tokens: int,
        batch_size: int | None = None,
        backend: Any = None,
        max_decode_q_len: int | None = None,
        device: Any = None,
    ) -> None:
        settings = _settings(model)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: a positive int, got {max_tokens!r}")
        self.settings = settings
        self.backend = backend if backend is not None else settings.backend
        self.max_decode_q_len = _check_q_len(
            settings.max_decode_q_len if max_decode_q_len is None else max_decode_q_len
        )
        _check_decode_shape(self.backend, settings.num_heads, self.max_decode_q_len)
        self.pages_per_request = -(-max_tokens // PAGE_SIZE)
        self.capacity = self.pages_per_request * PAGE_SIZE
        self.num_heads = settings.num_heads
        self.first_layer = min(settings.layers)
        self.last_layer = max(settings.layers)
        self.kv: Tensor | None = None
        self.block_table: Tensor | None = None
        self.seqlens: Tensor | None = None
        self.columns: Tensor | None = None
        self.overflow: Tensor | None = None
        self._buffers: dict[int, tuple[Tensor, Tensor]] = {}
        self._batch = -1
        self._step: _Step | None = None
        super().__init__(layers=[SnapMLALayer(self, i) for i in range(self.last_layer + 1)])
        if batch_size is not None:
            self._allocate(batch_size, device if device is not None else settings.device)

    # -- allocation and state

    def _allocate(self, batch: int, device: Any) -> None:
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"SnapMLACache: batch_size must be a positive int, got {batch!r}")
        if self.kv is not None:
            if batch != self._batch:
                raise ValueError(
                    f"SnapMLACache: allocated for batch {self._batch}, got a step of batch "
                    f"{batch}"
                )
            return
        if _compiling():
            raise RuntimeError(
                "SnapMLACache: allocate the cache before a compiled call "
                "(SnapMLACache(model, max_tokens=..., batch_size=...))"
            )
        device = torch.device(device)
        pages = batch * self.pages_per_request
        self.kv = self.backend.empty_cache(len(self.layers), pages, device)
        self.block_table = torch.arange(pages, dtype=torch.int32, device=device).view(
            batch, self.pages_per_request
        )
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=device)
        self.columns = torch.zeros((), dtype=torch.int64, device=device)
        self.overflow = torch.zeros((), dtype=torch.bool, device=device)
        for q_len in range(1, self.max_decode_q_len + 1):
            self._buffers[q_len] = self.backend.decode_buffers(
                batch, self.num_heads, self.pages_per_request, q_len, device
            )
        self._batch = batch
        if device.type == "cuda":
            # Fixed addresses: CUDA graphs capture them as they are, not as copied inputs.
            for t in (self.kv, self.block_table, self.seqlens, self.columns, self.overflow):
                torch._dynamo.mark_static_address(t)
            for plan, workspace in self._buffers.values():
                torch._dynamo.mark_static_address(plan)
                torch._dynamo.mark_static_address(workspace)

    def early_initialization(
        self, batch_size: int, num_heads: Any, head_dim: Any, dtype: Any, device: Any
    ) -> None:
        self._allocate(batch_size, device)

    @property
    def batch_size(self) -> int:  # type: ignore[override]
        return self._batch

    @property
    def is_initialized(self) -> bool:  # type: ignore[override]
        return self.kv is not None

    def memory_bytes(self) -> int:
        """Device bytes of the cache tensor (0 before allocation)."""
        return 0 if self.kv is None else self.kv.numel() * self.kv.element_size()

    def get_seq_length(self, layer_idx: int = 0) -> Any:
        """Mask columns consumed so far (a device tensor, as transformers' StaticCache
        reports it; 0 before the first step): each request's own length is ``seqlens``."""
        return 0 if self.columns is None else self.columns

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.capacity

    def check(self) -> None:
        """Raise if a request outgrew ``max_tokens`` (one host synchronization)."""
        if self.overflow is not None and bool(self.overflow):
            raise RuntimeError(
                f"SnapMLACache: a request outgrew max_tokens ({self.capacity} tokens a request); "
                "its later tokens were not cached and the generated tokens after that are not "
                "valid. Prepare or build the cache with a larger max_tokens."
            )

    def reset(self) -> None:
        if self.kv is not None:
            self.seqlens.zero_()
            self.columns.zero_()
            self.overflow.zero_()
        self._step = None

    # -- refusals

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> Any:  # fmt: skip
        if not kwargs.pop("snapmla", False):
            raise RuntimeError(
                "SnapMLACache is filled by the attention modules snapmla.transformers.prepare "
                f"patched; layer {layer_idx}'s module called update() itself (not prepared?)"
            )
        return self.layers[layer_idx].update(key_states, value_states)

    def reorder_cache(self, beam_idx: Tensor) -> None:
        raise NotImplementedError(
            "SnapMLACache: beam search (reorder_cache) is not supported; use greedy or sampling"
        )

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("SnapMLACache: batch_repeat_interleave is not supported")

    def batch_select_indices(self, indices: Tensor) -> None:
        raise NotImplementedError("SnapMLACache: batch_select_indices is not supported")

    def crop(self, tokens_to_remove: int) -> None:
        """Remove each request's last ``-tokens_to_remove`` tokens (a negative count, as
        assisted decoding passes it; a positive one keeps that many mask columns). The removed
        columns must be each request's own last tokens (no padding among them)."""
        if self.kv is None or tokens_to_remove == 0:
            return
        if tokens_to_remove > 0:  # keep that many columns (one host synchronization)
            n = int(self.columns) - tokens_to_remove
            if n <= 0:
                return
        else:
            n = -tokens_to_remove
        self.seqlens.sub_(n).clamp_(min=0)
        self.columns.sub_(n).clamp_(min=0)

    # -- one step

    def begin_step(self, attention_mask: Tensor | None, batch: int, q_len: int,
                   device: torch.device) -> _Step:  # fmt: skip
        """Book a step of ``q_len`` new tokens for each of ``batch`` requests: their slots
        (padding, the mask's zeros among its last ``q_len`` columns, gets -1), the new lengths
        and, for a decode step, the plan. Called by the first attention layer of each forward."""
        self._allocate(batch, device)
        valid = _validity(attention_mask, batch, q_len)
        old = self.seqlens
        if valid is None:
            count = torch.full((batch,), q_len, dtype=torch.int32, device=device)
            rank = torch.arange(q_len, device=device).expand(batch, q_len)
            real = None
        else:
            real = valid.to(device=device, dtype=torch.bool)
            ones = real.to(torch.int32)
            count = ones.sum(dim=1, dtype=torch.int32)
            rank = ones.cumsum(dim=1) - 1
        pos = old.long()[:, None] + rank  # [b, s]: each new token's place in its request
        ok = (pos >= 0) & (pos < self.capacity)
        if real is not None:
            ok = ok & real
        page = self.block_table.gather(1, (pos // PAGE_SIZE).clamp(0, self.pages_per_request - 1))
        slots = torch.where(ok, page.long() * PAGE_SIZE + pos % PAGE_SIZE, -1).reshape(-1)
        decode = q_len <= self.max_decode_q_len
        step = _Step(q_len=q_len, slots=slots, decode=decode)
        new = old + count
        if not decode:
            step.valid = real
            step.old_lens = old.clone()
        self.overflow.logical_or_((new > self.capacity).any())
        self.seqlens.copy_(new.clamp(max=self.capacity))
        self.columns.add_(q_len)
        if decode:
            plan, _ = self._buffers[q_len]
            self.backend.plan(plan, self.seqlens, self.num_heads, self.pages_per_request, q_len)
        elif not _compiling():
            # Eager prefill: the longest prefix, and whether plain causal attention suffices.
            step.prefix = int(step.old_lens.max())
            step.dense = step.prefix == 0 and (real is None or bool(real.all()))
        else:
            step.prefix = self.capacity
        self._step = step
        return step

    def context_slots(self, step: _Step) -> Tensor:
        """int64 ``[b * prefix]``: the slots of each request's cached prefix, padded with -1."""
        j = torch.arange(step.prefix, device=self.seqlens.device)
        page = self.block_table[:, (j // PAGE_SIZE).clamp(max=self.pages_per_request - 1)]
        slots = page.long() * PAGE_SIZE + j % PAGE_SIZE
        return torch.where(j[None, :] < step.old_lens.long()[:, None], slots, -1).reshape(-1)


def _validity(attention_mask: Any, batch: int, q_len: int) -> Tensor | None:
    """bool ``[batch, q_len]`` of the new tokens (the 2D mask's last columns), or None."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor) or attention_mask.dim() != 2:
        shape = getattr(attention_mask, "shape", type(attention_mask).__name__)
        raise ValueError(
            "snapmla attention: attention_mask must be a 2D [batch, tokens] padding mask (or "
            f"None), got {shape}"
        )
    if attention_mask.shape[0] != batch or attention_mask.shape[1] < q_len:
        raise ValueError(
            f"snapmla attention: attention_mask {list(attention_mask.shape)} does not cover "
            f"{batch} requests x {q_len} new tokens"
        )
    return attention_mask[:, -q_len:]


def _check_decode_shape(backend: Any, num_heads: int, max_q_len: int) -> None:
    """The backend's refusal of decode steps it cannot run (a backend without the check runs
    every shape)."""
    check = getattr(backend, "check_decode_shape", None)
    if check is not None:
        check(num_heads, max_q_len)


def _check_q_len(q_len: Any) -> int:
    if not isinstance(q_len, int) or not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"max_decode_q_len: an int in 1..{MAX_Q_LEN}, got {q_len!r}")
    return q_len


# ----------------------------------------------------------------- the attention forward


# The cache argument's names across transformers 5.x (5.25 renames past_key_values to cache).
_CACHE_NAMES = ("past_key_values", "cache")


def _argument(args: tuple, kwargs: dict, order: tuple[str, ...], name: str) -> Any:
    i = order.index(name)
    if len(args) > i:
        return args[i]
    for alias in _CACHE_NAMES if name == "past_key_values" else (name,):
        if alias in kwargs:
            return kwargs[alias]
    return None


def _mla_forward(self: Any, hidden_states: Tensor, *args: Any, **kwargs: Any) -> Any:
    """The patched forward of an MLA attention module (see the module docstring)."""
    family: _Family = self._snapmla_family
    cache = _argument(args, kwargs, family.order, "past_key_values")
    if not isinstance(cache, SnapMLACache):
        # No snapmla cache (a forward without cache, or transformers' own DynamicCache): the
        # stock forward, whose attention (the "snapmla" implementation) refuses a prefix.
        return type(self).forward(self, hidden_states, *args, **kwargs)
    position_embeddings = _argument(args, kwargs, family.order, "position_embeddings")
    attention_mask = _argument(args, kwargs, family.order, "attention_mask")
    b, s = hidden_states.shape[:-1]
    layer = self.layer_idx
    step = (
        cache.begin_step(attention_mask, b, s, hidden_states.device)
        if layer == cache.first_layer
        else cache._step
    )
    if step is None or step.q_len != s:
        raise RuntimeError(
            f"SnapMLACache: layer {layer} ran before layer {cache.first_layer} began the step"
        )
    q_pass, q_rot, c_kv, k_rot = family.project(self, hidden_states, position_embeddings)
    cache.update(c_kv, k_rot, layer, snapmla=True)
    if step.decode:
        out = _absorbed_decode(self, cache, step, q_pass, q_rot)
    else:
        out = _prefill(self, cache, step, q_pass, q_rot, c_kv, k_rot)
    if layer == cache.last_layer:
        cache._step = None
    return self.o_proj(out), None


def _absorbed_decode(m: Any, cache: SnapMLACache, step: _Step, q_pass: Tensor, q_rot: Tensor
                     ) -> Tensor:  # fmt: skip
    """Attention of ``s <= max_decode_q_len`` new tokens through the backend's decode:
    returns ``[b, s, h * v_head_dim]``."""
    b, h, s, nope = q_pass.shape
    v_dim = m.v_head_dim
    w = m.kv_b_proj.weight.view(h, nope + v_dim, m.kv_lora_rank)
    w_uk, w_uv = w[:, :nope], w[:, nope:]  # [h, nope, 512], [h, v, 512]
    # q_nope @ W_UK per head: [h, b*s, nope] @ [h, nope, 512]
    q_lat = torch.bmm(q_pass.transpose(0, 1).reshape(h, b * s, nope), w_uk)
    q = torch.cat(
        [q_lat.view(h, b, s, -1).permute(1, 2, 0, 3), q_rot.transpose(1, 2)], dim=-1
    )  # [b, s, h, 576]
    plan, workspace = cache._buffers[s]
    out = cache.backend.decode(
        cache.kv, m.layer_idx, q, cache.block_table, cache.seqlens, plan, workspace, m.scaling
    )  # [b, s, h, 512]
    out = out.to(q_pass.dtype).permute(2, 0, 1, 3).reshape(h, b * s, -1)
    o = torch.bmm(out, w_uv.transpose(1, 2))  # [h, b*s, v]
    return o.view(h, b, s, v_dim).permute(1, 2, 0, 3).reshape(b, s, h * v_dim)


def _prefill(m: Any, cache: SnapMLACache, step: _Step, q_pass: Tensor, q_rot: Tensor,
             c_kv: Tensor, k_rot: Tensor) -> Tensor:  # fmt: skip
    """The stock attention math over the cached prefix (read back dequantized) and the new
    tokens: returns ``[b, s, h * v_head_dim]``."""
    b, h, s, _ = q_pass.shape
    p = step.prefix
    if p > 0:
        c_pre, k_pre = cache.backend.fetch_dequant(cache.kv, m.layer_idx, cache.context_slots(step))
        c_kv = torch.cat([c_pre.to(c_kv.dtype).view(b, 1, p, -1), c_kv], dim=2)
        k_rot = torch.cat([k_pre.to(k_rot.dtype).view(b, 1, p, -1), k_rot], dim=2)
    key, value = m.expand_kv(c_kv, k_rot)  # [b, h, p + s, nope + rope], [b, h, p + s, v]
    query = torch.cat([q_pass, q_rot], dim=-1)
    if step.dense:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=m.scaling)
    else:
        mask = _prefill_mask(step, b, s, query.device)
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask[:, None], scale=m.scaling
        )
    return out.transpose(1, 2).reshape(b, s, -1)


def _prefill_mask(step: _Step, b: int, s: int, device: torch.device) -> Tensor:
    """bool ``[b, s, prefix + s]``: a query sees its request's cached prefix, the real new
    tokens up to itself, and itself (so a padding query's row is never empty)."""
    t = torch.arange(s, device=device)
    causal = t[None, :] <= t[:, None]  # [query, key]
    new = causal[None].expand(b, s, s)
    if step.valid is not None:
        new = (new & step.valid[:, None, :]) | torch.eye(s, dtype=torch.bool, device=device)
    if step.prefix == 0:
        return new
    j = torch.arange(step.prefix, device=device)
    prefix = (j[None, :] < step.old_lens.long()[:, None])[:, None, :].expand(b, s, step.prefix)
    return torch.cat([prefix, new], dim=-1)


def _attention_without_snapmla_cache(module: Any, query: Tensor, key: Tensor, value: Tensor,
                                     attention_mask: Any, scaling: float, dropout: float = 0.0,
                                     **kwargs: Any) -> tuple[Tensor, None]:  # fmt: skip
    """The "snapmla" attention implementation as transformers calls it from a stock forward
    (no SnapMLACache: a forward without cache): causal SDPA over the new tokens with the 2D
    padding mask. Keys beyond the new tokens (another cache's prefix) are refused."""
    b, _, s, _ = query.shape
    if key.shape[2] != s:
        raise RuntimeError(
            "snapmla attention: this model was prepared by snapmla.transformers.prepare; pass a "
            "snapmla.transformers.SnapMLACache (generate makes one), not another Cache with a "
            "prefix"
        )
    step = _Step(q_len=s, slots=query.new_zeros(0, dtype=torch.int64), decode=False)
    step.valid = _validity(attention_mask, b, s)
    mask = _prefill_mask(step, b, s, query.device)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask[:, None], dropout_p=dropout, scale=scaling
    )
    return out.transpose(1, 2).contiguous(), None


def _padding_mask(batch_size: int = 0, q_length: int = 0, kv_length: int = 0, *,
                  attention_mask: Any = None, **kwargs: Any) -> Any:  # fmt: skip
    """The "snapmla" mask: the 2D padding mask's last ``q_length`` columns (the new tokens)."""
    if attention_mask is None or not isinstance(attention_mask, Tensor):
        return attention_mask
    if attention_mask.dim() != 2:
        return attention_mask  # refused by the attention, naming its shape
    return attention_mask[:, -q_length:]


def _masks_for_generate(*, config: Any = None, inputs_embeds: Tensor, attention_mask: Any,
                        **kwargs: Any) -> Any:  # fmt: skip
    """``create_masks_for_generate`` of a prepared model: the same 2D slice (a small, fixed
    shape input for the compiled decode step)."""
    return _padding_mask(q_length=inputs_embeds.shape[1], attention_mask=attention_mask)


_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, _attention_without_snapmla_cache)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _padding_mask)
    _registered = True


# ------------------------------------------------------------------------------- prepare


@dataclass
class _Settings:
    backend: Any
    max_tokens: int | None
    max_decode_q_len: int
    num_heads: int
    layers: tuple[int, ...]
    device: torch.device
    modules: list[Any] = field(default_factory=list)
    configs: list[tuple[Any, Any]] = field(default_factory=list)  # (config, old implementation)
    generate: Any = None


def _settings(model: Any) -> _Settings:
    settings = getattr(model, "_snapmla", None)
    if settings is None:
        raise ValueError(
            "SnapMLACache: the model was not prepared (snapmla.transformers.prepare(model))"
        )
    return settings


def _find_modules(model: Any) -> list[tuple[Any, _Family]]:
    found, refused, others = [], [], []
    for module in model.modules():
        name = type(module).__name__
        if name in _FAMILIES:
            found.append((module, _FAMILIES[name]))
        elif name in _REFUSED:
            refused.append(f"{name}: {_REFUSED[name]}")
        elif name.endswith(("Attention", "MLA")):
            others.append(name)
    if refused:
        raise ValueError("snapmla.transformers.prepare: " + "; ".join(sorted(set(refused))))
    if not found:
        model_type = getattr(getattr(model, "config", None), "model_type", "?")
        raise ValueError(
            f"snapmla.transformers.prepare: model type {model_type!r} has no MLA attention "
            f"module snapmla serves (found {sorted(set(others)) or 'none'}); supported model "
            f"types: {', '.join(supported_model_types())}"
        )
    for module, _ in found:
        name = type(module).__name__
        for attr, want in (("kv_lora_rank", CONTENT_DIM), ("qk_rope_head_dim", ROPE_DIM)):
            if getattr(module, attr) != want:
                raise ValueError(
                    f"snapmla.transformers.prepare: {name}.{attr} must be {want} (snapmla's "
                    f"cache holds 512 + 64 per token), got {getattr(module, attr)}"
                )
        if not 1 <= module.num_heads <= MAX_HEADS:
            raise ValueError(
                f"snapmla.transformers.prepare: {name}.num_heads must be 1..{MAX_HEADS}, got "
                f"{module.num_heads}"
            )
    heads = {module.num_heads for module, _ in found}
    if len(heads) != 1:
        raise ValueError(f"snapmla.transformers.prepare: layers differ in num_heads {heads}")
    layers = [module.layer_idx for module, _ in found]
    if len(set(layers)) != len(layers):
        raise ValueError("snapmla.transformers.prepare: two attention modules share a layer_idx")
    return found


def prepare(
    model: Any,
    *,
    max_tokens: int | None = None,
    backend: Any = None,
    kernel: str = "auto",
    q_precision: str = "fp8",
    max_decode_q_len: int = 1,
) -> Any:
    """Make ``model`` decode with snapmla's FP8 paged cache; returns ``model``.

    ``max_tokens``: the default capacity per request of the caches ``generate`` makes (else
    the call's prompt length plus ``max_new_tokens``, which a call may not exceed when given);
    ``backend``: the GPU library (:class:`SnapMLABackend` with ``kernel`` and ``q_precision``,
    the default) or a stand-in such as :class:`TorchBackend`; ``max_decode_q_len``: steps of up
    to this many new tokens per request (1..4) take snapmla's decode, longer ones the prefill
    path. ``q_precision="fp8x2"`` (the two-term query) with ``kernel`` ``"auto"`` or ``"fast"``
    is refused here where ``max_decode_q_len * num_heads`` passes the library's limit for
    those kernels (``SnapMLABackend.check_decode_shape``). :func:`restore` undoes it."""
    if getattr(model, "_snapmla", None) is not None:
        raise ValueError("snapmla.transformers.prepare: the model is prepared already")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens: a positive int or None, got {max_tokens!r}")
    max_decode_q_len = _check_q_len(max_decode_q_len)
    found = _find_modules(model)
    if backend is None:
        backend = SnapMLABackend(kernel=kernel, q_precision=q_precision)
    first = found[0][0]
    _check_decode_shape(backend, first.num_heads, max_decode_q_len)
    _register()
    settings = _Settings(
        backend=backend,
        max_tokens=max_tokens,
        max_decode_q_len=max_decode_q_len,
        num_heads=first.num_heads,
        layers=tuple(module.layer_idx for module, _ in found),
        device=first.kv_b_proj.weight.device,
    )
    for module, family in found:
        module._snapmla_family = family
        module.forward = types.MethodType(_mla_forward, module)
        settings.modules.append(module)
        config = module.config
        if all(config is not c for c, _ in settings.configs):
            settings.configs.append((config, config._attn_implementation))
            config._attn_implementation = ATTN_IMPLEMENTATION
    settings.generate = model.generate
    model._snapmla = settings
    model.create_masks_for_generate = _masks_for_generate
    model.generate = types.MethodType(_generate, model)
    return model


def restore(model: Any) -> Any:
    """Undo :func:`prepare`: the stock forwards, attention implementation and ``generate``."""
    settings = _settings(model)
    for module in settings.modules:
        del module.forward
        del module._snapmla_family
    for config, implementation in settings.configs:
        config._attn_implementation = implementation
    del model.generate
    del model.create_masks_for_generate
    del model._snapmla
    return model


def _generate(model: Any, *args: Any, **kwargs: Any) -> Any:
    """``model.generate`` of a prepared model: refuses what the cache cannot do, makes a
    :class:`SnapMLACache` when none is passed, and checks it afterwards."""
    settings: _Settings = model._snapmla
    config = kwargs.get("generation_config") or model.generation_config

    def option(name: str) -> Any:
        return kwargs.get(name, getattr(config, name, None))

    if (option("num_beams") or 1) > 1:
        raise ValueError(
            "snapmla.transformers: beam search (num_beams > 1) reorders cache rows, which "
            "SnapMLACache does not do; use greedy decoding or sampling"
        )
    cache = next((kwargs[n] for n in _CACHE_NAMES if kwargs.get(n) is not None), None)
    if cache is None and option("use_cache") is not False:
        inputs = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
        if not isinstance(inputs, Tensor):
            inputs = kwargs.get("inputs_embeds")
        if not isinstance(inputs, Tensor):
            raise ValueError("snapmla.transformers: generate needs input_ids or inputs_embeds")
        batch, prompt = inputs.shape[0], inputs.shape[1]
        new_tokens = option("max_new_tokens")
        if new_tokens is None:
            new_tokens = max((option("max_length") or prompt) - prompt, 0)
        need = prompt + new_tokens
        if settings.max_tokens is not None and need > settings.max_tokens:
            raise ValueError(
                f"snapmla.transformers: prompt ({prompt}) + max_new_tokens ({new_tokens}) "
                f"exceeds max_tokens ({settings.max_tokens}) given to prepare"
            )
        copies = option("num_return_sequences") or 1
        cache = SnapMLACache(
            model,
            max_tokens=settings.max_tokens or need,
            batch_size=batch * copies,
            device=inputs.device,
        )
        kwargs["past_key_values"] = cache
    out = settings.generate(*args, **kwargs)
    if isinstance(cache, SnapMLACache):
        cache.check()
    return out

