"""Engine layouts on the GPU: one tensor per layer (``KVCache(layers=...)``, the C
API's ``config.layer_memory``), pages inside larger slots (``page_stride``) and q_nope / q_pe
apart (``q_pe=``). Each gives the bytes of the packed, concatenated layout."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _util import (
    SM_SCALE,
    DecodeCase,
    device_inputs,
    make_case,
    make_plan,
    nan_torch,
    page_slots,
    poisoned_outputs,
    random_bf16,
    synchronize,
    to_torch,
    torch_module,
)

import snapmla
from snapmla import reference as ref

pytestmark = pytest.mark.gpu


def _strided_cache(case: DecodeCase, page_stride: int, slack: int) -> tuple[Any, Any]:
    """``(memory, cache)``: the case's image with each page in a ``page_stride``-byte slot (0:
    packed), the slot's slack filled with the byte ``slack``; memory is [layers, pages, slot]."""
    torch = torch_module()
    slot = page_stride or ref.PAGE_BYTES
    memory = torch.full(
        (case.num_layers, case.num_pages, slot), slack, dtype=torch.uint8, device="cuda"
    )
    memory[:, :, : ref.PAGE_BYTES] = to_torch(case.image).view(
        case.num_layers, case.num_pages, ref.PAGE_BYTES
    )
    cache = snapmla.KVCache(
        case.num_layers, case.num_pages, buffer=memory.view(-1), page_stride=page_stride
    )
    return memory, cache


def test_per_layer_cache_matches_the_contiguous_one(rng: np.random.Generator) -> None:
    torch = torch_module()
    case = make_case(rng, [130, 64, 1, 700], num_heads=16, num_layers=3)
    layer_bytes = case.num_pages * ref.PAGE_BYTES
    image = to_torch(case.image)
    whole = snapmla.KVCache(case.num_layers, case.num_pages, buffer=image.clone())
    # Each layer in its own allocation, in reverse address order of no consequence.
    parts = [image[l * layer_bytes : (l + 1) * layer_bytes].clone() for l in range(case.num_layers)]
    split = snapmla.KVCache(case.num_layers, case.num_pages, layers=parts)
    assert split.layer_data_ptr(2) == parts[2].data_ptr()
    q, bt, sl = device_inputs(case)
    plan = make_plan(case, sl)
    for layer in range(case.num_layers):
        outs = []
        for cache in (whole, split):
            out, lse = poisoned_outputs(*case.q.shape[:3])
            snapmla.decode(cache, layer, q, bt, sl, plan, softmax_scale=SM_SCALE, out=out, lse=lse)
            outs.append((out, lse))
        synchronize()
        assert torch.equal(outs[0][0].view(torch.int16), outs[1][0].view(torch.int16)), layer
        assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32)), layer
        assert torch.isfinite(outs[0][0].float()).all()
    # Append into layer 1 of both, then fetch it back from both.
    n = 20
    c_kv = to_torch(random_bf16(rng, (n, ref.CONTENT_DIM), 0.5, 1.0))
    k_pe = to_torch(random_bf16(rng, (n, ref.ROPE_DIM), 0.5, 1.0))
    slots = torch.from_numpy(page_slots(case.block_table[3], n).astype(np.int64)).cuda()
    for cache in (whole, split):
        cache.append(1, c_kv, k_pe, slots)
    synchronize()
    assert torch.equal(whole.buffer[layer_bytes : 2 * layer_bytes], parts[1])
    assert torch.equal(whole.buffer[:layer_bytes], parts[0])  # other layers untouched
    fetched = []
    for cache in (whole, split):
        c_out, k_out = nan_torch((n, ref.CONTENT_DIM)), nan_torch((n, ref.ROPE_DIM))
        cache.fetch_dequant(1, slots, c_kv=c_out, k_pe=k_out)
        fetched.append((c_out, k_out))
    synchronize()
    assert torch.equal(fetched[0][0].view(torch.int16), fetched[1][0].view(torch.int16))
    assert torch.equal(fetched[0][1].view(torch.int16), fetched[1][1].view(torch.int16))
    whole.close()
    split.close()


@pytest.mark.parametrize("kernel", ["auto", "reference"])
@pytest.mark.parametrize("num_heads", [16, 32, 128])  # the seesaw kernel's PV widths 16, 32, 64
def test_page_stride_matches_the_packed_cache(
    rng: np.random.Generator, kernel: str, num_heads: int
) -> None:
    """``page_stride``: every page inside a larger slot (vLLM's 64 x 656 bytes), the slack
    poisoned; decode (every seesaw width), append and fetch-dequant give the packed cache's
    bytes, and the slack is never written."""
    torch = torch_module()
    stride = 64 * 656
    case = make_case(rng, [130, 64, 1, 700], num_heads=num_heads, num_layers=2)
    a = snapmla.KVCache(case.num_layers, case.num_pages, buffer=to_torch(case.image))
    strided, b = _strided_cache(case, stride, 0xFF)
    q, bt, sl = device_inputs(case)
    plan = make_plan(case, sl)
    for layer in range(case.num_layers):
        outs = []
        for cache in (a, b):
            out, lse = poisoned_outputs(*case.q.shape[:3])
            snapmla.decode(
                cache,
                layer,
                q,
                bt,
                sl,
                plan,
                softmax_scale=SM_SCALE,
                out=out,
                lse=lse,
                kernel=kernel,
            )
            outs.append((out, lse))
        synchronize()
        assert torch.equal(outs[0][0].view(torch.int16), outs[1][0].view(torch.int16)), layer
        assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32)), layer
    n = 20
    c_kv = to_torch(random_bf16(rng, (n, ref.CONTENT_DIM), 0.5, 1.0))
    k_pe = to_torch(random_bf16(rng, (n, ref.ROPE_DIM), 0.5, 1.0))
    slots = torch.from_numpy(page_slots(case.block_table[3], n).astype(np.int64)).cuda()
    for cache in (a, b):
        cache.append(1, c_kv, k_pe, slots)
    synchronize()
    view = strided.view(case.num_layers, case.num_pages, stride)
    assert torch.equal(view[:, :, : ref.PAGE_BYTES].reshape(-1), a.buffer)
    assert bool((view[:, :, ref.PAGE_BYTES :] == 0xFF).all()), "the slack was written"
    fetched = []
    for cache in (a, b):
        c_out, k_out = nan_torch((n, ref.CONTENT_DIM)), nan_torch((n, ref.ROPE_DIM))
        cache.fetch_dequant(1, slots, c_kv=c_out, k_pe=k_out)
        fetched.append((c_out, k_out))
    synchronize()
    assert torch.equal(fetched[0][0].view(torch.int16), fetched[1][0].view(torch.int16))
    assert torch.equal(fetched[0][1].view(torch.int16), fetched[1][1].view(torch.int16))
    a.close()
    b.close()


@pytest.mark.parametrize("kernel", ["auto", "reference"])
def test_q_nope_and_q_pe_apart_match_the_concatenated_query(
    rng: np.random.Generator, kernel: str
) -> None:
    """``q_pe=``: q_nope and q_pe in tensors of their own (here slices of one wider projection
    output, as engines hold them) give the bytes of the concatenated [.., 576] query."""
    torch = torch_module()
    case = make_case(rng, [300, 64, 1], num_heads=16, q_len=2)
    cache = snapmla.KVCache(case.num_layers, case.num_pages, buffer=to_torch(case.image))
    q, bt, sl = device_inputs(case)
    b, s_q, h, _ = case.q.shape
    wide = torch.full((b, s_q, h, 768), float("nan"), dtype=torch.bfloat16, device="cuda")
    wide[..., :512] = q[..., :512]
    wide[..., 640:704] = q[..., 512:]
    plan = make_plan(case, sl)
    outs = []
    for kwargs in ({"q": q}, {"q": wide[..., :512], "q_pe": wide[..., 640:704]}):
        out, lse = poisoned_outputs(b, s_q, h)
        query = kwargs.pop("q")
        snapmla.decode(
            cache,
            0,
            query,
            bt,
            sl,
            plan,
            softmax_scale=SM_SCALE,
            out=out,
            lse=lse,
            kernel=kernel,
            **kwargs,
        )
        outs.append((out, lse))
    synchronize()
    assert torch.equal(outs[0][0].view(torch.int16), outs[1][0].view(torch.int16))
    assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32))
    assert torch.isfinite(outs[0][0].float()).all()
    cache.close()


@pytest.mark.parametrize("page_stride", [0, 64 * 656])
def test_copy_slots_moves_tokens_byte_for_byte(rng: np.random.Generator, page_stride: int) -> None:
    """``copy_slots``: each destination slot gets the source slot's content, RoPE and scale
    bytes (fetch-dequant reads the same rows back), skipped pairs and every other byte stay."""
    torch = torch_module()
    case = make_case(rng, [200, 64], num_heads=16, num_layers=2, spare_pages=3)
    memory, cache = _strided_cache(case, page_stride, 0x5A)
    n = 40
    src = page_slots(case.block_table[0], n).astype(np.int64)
    used = set(case.block_table[0, :4].tolist()) | {int(case.block_table[1, 0])}
    spare = [p for p in range(case.num_pages) if p not in used]
    dst = (spare[0] * 64 + np.arange(n)).astype(np.int64)
    src[5], dst[7] = -1, -3  # skipped
    before = memory.clone()
    cache.copy_slots(1, torch.from_numpy(src).cuda(), torch.from_numpy(dst).cuda())
    synchronize()
    keep = [i for i in range(n) if src[i] >= 0 and dst[i] >= 0]
    got_c, got_k = nan_torch((len(keep), ref.CONTENT_DIM)), nan_torch((len(keep), ref.ROPE_DIM))
    want_c, want_k = nan_torch((len(keep), ref.CONTENT_DIM)), nan_torch((len(keep), ref.ROPE_DIM))
    cache.fetch_dequant(1, torch.from_numpy(dst[keep]).cuda(), c_kv=got_c, k_pe=got_k)
    cache.fetch_dequant(1, torch.from_numpy(src[keep]).cuda(), c_kv=want_c, k_pe=want_k)
    synchronize()
    assert torch.equal(got_c.view(torch.int16), want_c.view(torch.int16))
    assert torch.equal(got_k.view(torch.int16), want_k.view(torch.int16))
    # Only the destination page of layer 1 changed, and only the copied rows of it.
    changed = (memory != before).any(dim=2)
    assert changed.sum().item() == 1 and bool(changed[1, spare[0]])
    assert torch.equal(memory[:, :, ref.PAGE_BYTES :], before[:, :, ref.PAGE_BYTES :])
    page = memory[1, spare[0]]
    for row in (5, 7):  # the skipped pairs' destination rows (dst[5] and the row dst[7] had)
        assert torch.equal(
            page[row * ref.CONTENT_DIM : (row + 1) * ref.CONTENT_DIM],
            before[1, spare[0], row * ref.CONTENT_DIM : (row + 1) * ref.CONTENT_DIM],
        )
    cache.close()


@pytest.mark.parametrize("page_stride", [0, 64 * 656])
def test_gather_dequant_matches_fetch_by_slots(rng: np.random.Generator, page_stride: int) -> None:
    """``gather_dequant``: the rows of each request's tokens, by block table, equal
    fetch-dequant's of the same slots; rows no token maps to keep their poison, a bad page id
    gives NaN rows, tokens past the outputs are skipped."""
    torch = torch_module()
    case = make_case(rng, [130, 64, 0, 5], num_heads=16, num_layers=2)
    _, cache = _strided_cache(case, page_stride, 0x5A)
    table = case.block_table.copy()
    table[3, 0] = case.num_pages + 7  # request 3's page is outside the layer: NaN rows
    lens = case.seqlens.copy()
    starts = np.array([0, 140, 300, 210], np.int64)  # gaps between requests stay poisoned
    rows = 212  # request 3's rows 210..214: the last three fall outside and are skipped
    c_out, k_out = nan_torch((rows, ref.CONTENT_DIM)), nan_torch((rows, ref.ROPE_DIM))
    c_out.fill_(7.0)
    k_out.fill_(7.0)
    cache.gather_dequant(
        1,
        torch.from_numpy(table).cuda(),
        torch.from_numpy(lens).cuda(),
        torch.from_numpy(starts).cuda(),
        c_kv=c_out,
        k_pe=k_out,
    )
    for r in (0, 1):
        n = int(lens[r])
        slots = torch.from_numpy(page_slots(case.block_table[r], n).astype(np.int64)).cuda()
        want_c, want_k = nan_torch((n, ref.CONTENT_DIM)), nan_torch((n, ref.ROPE_DIM))
        cache.fetch_dequant(1, slots, c_kv=want_c, k_pe=want_k)
        synchronize()
        got = slice(int(starts[r]), int(starts[r]) + n)
        assert torch.equal(c_out[got].view(torch.int16), want_c.view(torch.int16)), r
        assert torch.equal(k_out[got].view(torch.int16), want_k.view(torch.int16)), r
    synchronize()
    assert bool((c_out[130:140] == 7.0).all()) and bool((c_out[204:210] == 7.0).all())
    assert bool(torch.isnan(c_out[210:212].float()).all()) and bool(
        torch.isnan(k_out[210:212].float()).all()
    )
    cache.close()
