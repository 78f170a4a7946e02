"""Backends for testing snapmla.transformers against the numerics contract.

* :class:`ReferenceBackend` runs the contract's own model, ``snapmla.reference`` (float64 NumPy,
  what the GPU kernels compute), on the CPU: the cache is a host image of snapmla's paged format
  (uint8 ``[layers, pages, 41216]``), ``append`` is ``quantize_kv`` + ``write_tokens``,
  ``fetch_dequant`` the reference's, ``decode`` gathers each request through its block-table row
  and runs ``decode_reference`` (causal; ``q_precision="fp8x2"``: the two-term query). Slow and
  exact: the yardstick for ``TorchBackend(quantize=True)``.
* :class:`PairedBackend` runs two backends side by side on identical inputs (each keeps its own
  cache, fed the same tokens): every ``fetch_dequant`` must agree bit for bit, every decode
  output's relative L2 distance is recorded per layer; the model continues on the first one's
  results. On the GPU: ``SnapMLABackend`` against ``TorchBackend(quantize=True)``.
"""

from __future__ import annotations

import numpy as np
import torch

from snapmla import reference as ref


class CudaScalarDivision(torch.overrides.TorchFunctionMode):
    """CUDA's rounding of a float tensor divided by a Python number, on any device: PyTorch's
    CUDA kernel computes ``x * (1 / c)`` (its reciprocal rounded to the tensor's dtype first),
    one ulp off the IEEE quotient for about half of all ``x`` when ``c`` is 448."""

    _DIVISIONS = (torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.__truediv__)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (
            func in self._DIVISIONS
            and len(args) == 2
            and isinstance(args[0], torch.Tensor)
            and args[0].is_floating_point()
            and isinstance(args[1], (int, float))
            and kwargs.get("rounding_mode") is None
        ):
            x, c = args
            return x * (torch.ones((), dtype=x.dtype) / torch.full((), float(c), dtype=x.dtype))
        return func(*args, **kwargs)


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    """A tensor's values rounded to BF16, as a host ``ml_dtypes.bfloat16`` array."""
    t = t.detach().to(torch.bfloat16).contiguous().view(torch.int16).cpu()
    return t.numpy().view(np.uint16).view(ref.BF16)


def _from_bf16(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


class ReferenceBackend:
    """``snapmla.reference`` behind the backend interface of ``snapmla.transformers``."""

    compileable = False
    kv_dtype = torch.bfloat16
    name = "reference"

    def __init__(self, q_precision: str = "fp8") -> None:
        if q_precision not in ("fp8", "fp8x2"):
            raise ValueError(f"q_precision: 'fp8' or 'fp8x2', got {q_precision!r}")
        self.q_precision = q_precision

    @staticmethod
    def _image(cache: torch.Tensor) -> tuple[np.ndarray, int]:
        return cache.view(-1).numpy(), cache.shape[1]

    def empty_cache(self, num_layers: int, num_pages: int, device) -> torch.Tensor:
        return torch.zeros((num_layers, num_pages, ref.PAGE_BYTES), dtype=torch.uint8)

    def append(self, cache, layer, c_kv, k_pe, slots) -> None:
        image, pages = self._image(cache)
        tokens = ref.quantize_kv(bf16_bits(c_kv), bf16_bits(k_pe))
        ref.write_tokens(image, pages, layer, slots.cpu().numpy(), *tokens)

    def fetch_dequant(self, cache, layer, slots):
        image, pages = self._image(cache)
        c_kv, k_pe = ref.fetch_dequant(image, pages, layer, slots.cpu().numpy())
        return _from_bf16(c_kv).to(slots.device), _from_bf16(k_pe).to(slots.device)

    def decode_buffers(self, batch, num_heads, max_pages, q_len, device):
        empty = torch.zeros(1, dtype=torch.uint8)
        return empty, empty.clone()

    def plan(self, plan, seqlens, num_heads, max_pages, q_len) -> None:
        pass

    def decode(self, cache, layer, q, block_table, seqlens, plan, workspace, softmax_scale):
        image, pages = self._image(cache)
        table, lens = block_table.cpu().numpy(), seqlens.cpu().numpy()
        kv = [ref.gather_request(image, pages, layer, table[r], lens[r]) for r in range(len(lens))]
        out, _ = ref.decode_reference(
            bf16_bits(q), kv, lens, softmax_scale, causal=True,
            q_terms=2 if self.q_precision == "fp8x2" else 1,
        )  # fmt: skip
        return torch.from_numpy(out).float().to(q.device)  # the kernel's fp32 O / l


class PairedBackend:
    """``first`` and ``second`` on identical inputs; see the module docstring. ``errors``:
    layer -> relative L2 distances of ``first``'s decode outputs from ``second``'s, one per
    call; ``fetches``: the number of bit-equal ``fetch_dequant`` calls."""

    compileable = False

    def __init__(self, first, second) -> None:
        self.first, self.second = first, second
        self.kv_dtype = first.kv_dtype
        self.name = f"{first.name}|{second.name}"
        self.errors: dict[int, list[float]] = {}
        self.fetches = 0
        self._second_kv: dict[int, torch.Tensor] = {}

    def check_decode_shape(self, num_heads: int, max_q_len: int) -> None:
        check = getattr(self.first, "check_decode_shape", None)
        if check is not None:
            check(num_heads, max_q_len)

    def worst(self) -> float:
        return max(max(v) for v in self.errors.values())

    def empty_cache(self, num_layers, num_pages, device):
        cache = self.first.empty_cache(num_layers, num_pages, device)
        self._second_kv[cache.data_ptr()] = self.second.empty_cache(num_layers, num_pages, device)
        return cache

    def append(self, cache, layer, c_kv, k_pe, slots) -> None:
        self.first.append(cache, layer, c_kv, k_pe, slots)
        self.second.append(self._second_kv[cache.data_ptr()], layer, c_kv, k_pe, slots)

    def fetch_dequant(self, cache, layer, slots):
        got = self.first.fetch_dequant(cache, layer, slots)
        want = self.second.fetch_dequant(self._second_kv[cache.data_ptr()], layer, slots)
        for name, a, b in zip(("c_kv", "k_pe"), got, want):
            b = b.to(a.dtype)
            if not torch.equal(a, b):
                bad = int((a != b).sum())
                raise AssertionError(
                    f"fetch_dequant layer {layer}: {name} differs from {self.second.name}'s in "
                    f"{bad} of {a.numel()} values, max |diff| {(a - b).abs().max().item():.3e}"
                )
        self.fetches += 1
        return got

    def decode_buffers(self, batch, num_heads, max_pages, q_len, device):
        return self.first.decode_buffers(batch, num_heads, max_pages, q_len, device)

    def plan(self, plan, seqlens, num_heads, max_pages, q_len) -> None:
        self.first.plan(plan, seqlens, num_heads, max_pages, q_len)

    def decode(self, cache, layer, q, block_table, seqlens, plan, workspace, softmax_scale):
        out = self.first.decode(cache, layer, q, block_table, seqlens, plan, workspace,
                                softmax_scale)  # fmt: skip
        want = self.second.decode(self._second_kv[cache.data_ptr()], layer, q, block_table,
                                  seqlens, plan, workspace, softmax_scale)  # fmt: skip
        self.errors.setdefault(layer, []).append(rel_l2(out.float(), want.float()))
        return out
