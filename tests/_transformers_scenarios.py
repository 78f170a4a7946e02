"""The models, inputs and bounds of tests/gpu/test_transformers_gpu.py, on any device: the GPU
tests run them with snapmla, tests/test_transformers_client.py with the contract's model
(``TorchBackend(quantize=True)``) at a smaller size, so that a bound the contract itself cannot
meet fails on the CPU too. The bounds and the measurements behind them: the GPU test module's
docstring."""

from __future__ import annotations

import torch
import transformers

YARN = {
    "rope_type": "yarn",
    "rope_theta": 1e4,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
VOCAB = 1024
INIT = 0.02  # initializer_range: DeepSeek-V3's configured value
PEAKED_INIT = 0.1  # nearly one-hot attention: the query's rounding is a large share
LAYER_BOUND = 0.06  # per-layer attention output, rel L2 above stock BF16's, vs fp32
LOGIT_BOUND = 0.03  # logits, rel L2 above stock BF16's, vs fp32
AGREE_FP8 = 0.9  # teacher-forced argmax agreement with fp32 stock, FP8 path
AGREE_BF16_SLACK = 0.05  # the FP8 path may trail stock BF16's agreement by this much


def config(moe: bool = False, layers: int = 3, heads: int = 128, init: float = INIT
           ) -> transformers.DeepseekV3Config:  # fmt: skip
    kw = dict(
        vocab_size=VOCAB,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=layers,
        first_k_dense_replace=1 if moe else layers,
        q_lora_rank=512,
        rope_parameters=YARN,
        max_position_embeddings=163840,
        num_mtp_layers=0,
        eos_token_id=None,
        pad_token_id=0,
        initializer_range=init,
    )
    if moe:
        kw.update(n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
                  moe_intermediate_size=256)  # fmt: skip
    return transformers.DeepseekV3Config(**kw)


def model(**kw) -> transformers.DeepseekV3ForCausalLM:
    """A random model of :func:`config` (seeded), fp32 on the CPU."""
    torch.manual_seed(0)
    return transformers.DeepseekV3ForCausalLM(config(**kw)).eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 distance ``||a - b|| / ||b||`` in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def inputs(lengths: list[int], new_tokens: int, device, seed: int = 1):
    """Left-padded ``input_ids`` and ``attention_mask`` of prompts with these lengths, then
    ``new_tokens`` more for every request."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(1, VOCAB, (len(lengths), width + new_tokens), generator=g)
    mask = torch.ones_like(ids)
    for r, n in enumerate(lengths):
        mask[r, : width - n] = 0
    return ids.masked_fill(mask == 0, 0).to(device), mask.to(device)


def teacher_forced(model, ids, mask, cache, prompt: int, chunks=None):
    """Logits of the last prompt position and of each following one-token step, with every
    attention module's output of those steps (per layer). The prompt's last chunk keeps only
    its last position's logits, as generate does."""
    attn = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):

        def hook(mod, args, out, i=i):
            if out[0].shape[1] == 1:
                attn.setdefault(i, []).append(out[0].float())

        hooks.append(layer.self_attn.register_forward_hook(hook))
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = []
    try:
        with torch.no_grad():
            start = 0
            for width in chunks or [prompt]:
                end = start + width
                out = model(input_ids=ids[:, start:end], attention_mask=mask[:, :end],
                            position_ids=pos[:, start:end], past_key_values=cache,
                            use_cache=True, logits_to_keep=1)  # fmt: skip
                start = end
            logits.append(out.logits[:, -1].float())
            for t in range(prompt, ids.shape[1]):
                out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1],
                            position_ids=pos[:, t : t + 1], past_key_values=cache,
                            use_cache=True)  # fmt: skip
                logits.append(out.logits[:, -1].float())
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(logits, 1), {i: torch.cat(v, 1) for i, v in attn.items()}


def check_against_stock(got, bf16, fp32) -> None:
    """The end-to-end bounds: ``got``, ``bf16`` (stock BF16) and ``fp32`` (stock fp32) are
    :func:`teacher_forced`'s results on the same inputs."""
    (logits, attn), (bf_logits, bf_attn), (ref_logits, ref_attn) = got, bf16, fp32
    for i in ref_attn:
        err, err_bf = rel(attn[i], ref_attn[i]), rel(bf_attn[i], ref_attn[i])
        assert err <= err_bf + LAYER_BOUND, f"layer {i}: {err:.4f} (stock BF16 {err_bf:.4f})"
    err, err_bf = rel(logits, ref_logits), rel(bf_logits, ref_logits)
    assert err <= err_bf + LOGIT_BOUND, f"logits: {err:.4f} (stock BF16 {err_bf:.4f})"
    agree = (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
    agree_bf = (bf_logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
    assert agree >= min(AGREE_FP8, agree_bf - AGREE_BF16_SLACK), (agree, agree_bf)
