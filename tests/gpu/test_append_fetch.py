"""KVCache.append (fused K-append) and KVCache.fetch_dequant against the numpy reference.

Append must write exactly the bytes of the reference packing into the touched slots and nothing
else (the whole cache starts as 0xFF, i.e. NaN in every plane); fetch_dequant must reproduce
``reference.dequantize`` bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from _util import (
    BF16,
    FRAMEWORKS,
    POISON_BYTE,
    assert_bf16_equal,
    assert_bytes_equal,
    download,
    nan_torch,
    random_bf16,
    synchronize,
    to_device,
    to_numpy,
    to_torch,
    upload,
)

import snapmla
from snapmla import reference as ref

pytestmark = pytest.mark.gpu


def _new_cache(num_layers: int, num_pages: int, framework: str) -> snapmla.KVCache:
    """A poisoned cache: on a torch buffer for torch, on snapmla's own (CuPy) memory else."""
    nbytes = num_layers * num_pages * ref.PAGE_BYTES
    if framework == "torch":
        buffer = to_torch(np.full(nbytes, POISON_BYTE, np.uint8))
        cache = snapmla.KVCache(num_layers, num_pages, buffer=buffer)
    else:
        cache = snapmla.KVCache(num_layers, num_pages)
        upload(cache, np.full(nbytes, POISON_BYTE, np.uint8))
    assert cache.nbytes == nbytes
    return cache


def _special_tokens(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n tokens of widely varying magnitude, with the corner cases of the contract."""
    c = random_bf16(rng, (n, 512), std=1.0, spread=12.0)
    k = random_bf16(rng, (n, 64), std=1.0, spread=12.0)
    c[0] = 0  # amax 0: scale 2^-32, content 0
    c[1] = 0
    k[1] = np.float32(1e30)  # k_pe / 2^-32 overflows fp32: rope +inf
    c[2] = np.float32(2.0**-120)  # amax / 448 below 2^-32: floor
    c[3] = np.float32(3.0e38)  # near bf16 max
    c[4, ::2] = np.float32(1e-30)  # tiny values next to a big one: FP8 subnormals and zeros
    c[4, 1] = np.float32(1e3)
    c[5] = -np.abs(c[5].astype(np.float32)).astype(BF16)  # all negative
    return c, k


def _strided(a: np.ndarray, extra: int, framework: str, offset: int = 16):
    """``a`` on the device as a row-strided view of a wider array (torch, cupy)."""
    n, d = a.shape
    wide = np.full((n, d + extra), np.nan, np.float32).astype(a.dtype)
    wide[:, offset : offset + d] = a
    dev = to_device(wide, framework)
    return dev[:, offset : offset + d]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_append_writes_reference_bytes(rng: np.random.Generator, framework: str) -> None:
    num_layers, num_pages, layer = 3, 9, 1
    capacity = num_pages * 64
    cache = _new_cache(num_layers, num_pages, framework)
    n_real = 300
    slots = rng.permutation(capacity)[:n_real].astype(np.int64)
    skipped = np.array([-1, -7, -(2**40), capacity, capacity + 5, 2**40], np.int64)
    slots = np.concatenate([slots, skipped])
    rng.shuffle(slots)
    n = slots.size
    c, k = _special_tokens(rng, n)
    if framework == "jax":  # JAX arrays are always dense
        c_dev, k_dev = to_device(c, framework), to_device(k, framework)
    else:
        c_dev, k_dev = _strided(c, 128, framework), _strided(k, 40, framework, offset=8)
    cache.append(layer, c_dev, k_dev, to_device(slots, framework))
    got = download(cache)
    want = np.full(cache.nbytes, POISON_BYTE, np.uint8)
    ref.write_tokens(want, num_pages, layer, slots, *ref.quantize_kv(c, k))
    assert_bytes_equal(got, want, num_pages, f"append ({framework})")


def test_append_special_values(rng: np.random.Generator) -> None:
    num_pages = 2
    cache = _new_cache(1, num_pages, "torch")
    c, k = _special_tokens(rng, 8)
    slots = np.arange(8, dtype=np.int64) * 3
    c[7, 9] = np.nan  # a NaN token: scale, content and rope all NaN
    cache.append(0, to_torch(c), to_torch(k), to_torch(slots))
    got = download(cache)
    content, rope, scale = ref.read_tokens(got, num_pages, 0, slots)
    assert scale[0] == np.float32(2.0**-32) and scale[1] == np.float32(2.0**-32)
    assert scale[2] == np.float32(2.0**-32)
    assert np.all(content[:2].astype(np.float32) == 0)
    assert np.all(np.isposinf(rope[1].astype(np.float32)))
    assert np.all(np.isfinite(rope[0].astype(np.float32)))
    assert np.all(np.abs(content[3].astype(np.float32)).max() == 448)
    assert np.isnan(scale[7])
    assert np.all(np.isnan(content[7].astype(np.float32)))
    assert np.all(np.isnan(rope[7].astype(np.float32)))
    # Everything but the NaN token is bit-exact.
    want = np.full(cache.nbytes, POISON_BYTE, np.uint8)
    ref.write_tokens(want, num_pages, 0, slots[:7], *ref.quantize_kv(c[:7], k[:7]))
    mask = np.ones(cache.nbytes, bool)
    base, row = 0, int(slots[7]) % 64  # page 0
    mask[base + row * 512 : base + row * 512 + 512] = False
    mask[base + 32768 + row * 128 : base + 32768 + row * 128 + 128] = False
    mask[base + 40960 + 4 * row : base + 40960 + 4 * row + 4] = False
    assert np.array_equal(got[mask], want[mask])


def test_append_zero_tokens_is_a_no_op(rng: np.random.Generator) -> None:
    cache = _new_cache(2, 3, "torch")
    empty_c = to_torch(np.zeros((0, 512), np.float32).astype(BF16))
    empty_k = to_torch(np.zeros((0, 64), np.float32).astype(BF16))
    cache.append(1, empty_c, empty_k, to_torch(np.zeros(0, np.int64)))
    assert np.all(download(cache) == POISON_BYTE)


def test_append_only_skipped_slots_writes_nothing(rng: np.random.Generator) -> None:
    cache = _new_cache(2, 3, "torch")
    c, k = random_bf16(rng, (4, 512)), random_bf16(rng, (4, 64))
    slots = np.array([-1, 3 * 64, 10**9, -5], np.int64)
    cache.append(0, to_torch(c), to_torch(k), to_torch(slots))
    assert np.all(download(cache) == POISON_BYTE)


def test_append_layers_are_independent(rng: np.random.Generator) -> None:
    num_layers, num_pages = 4, 3
    cache = _new_cache(num_layers, num_pages, "torch")
    want = np.full(cache.nbytes, POISON_BYTE, np.uint8)
    for layer in (2, 0, 3):
        n = int(rng.integers(1, 150))
        slots = rng.permutation(num_pages * 64)[:n].astype(np.int64)
        c, k = random_bf16(rng, (n, 512), spread=3), random_bf16(rng, (n, 64), spread=3)
        cache.append(layer, to_torch(c), to_torch(k), to_torch(slots))
        ref.write_tokens(want, num_pages, layer, slots, *ref.quantize_kv(c, k))
    assert_bytes_equal(download(cache), want, num_pages, "append to layers 2, 0, 3")


def _filled_cache(rng: np.random.Generator, num_layers: int, num_pages: int, framework: str):
    """A cache whose every layer holds random tokens in ~70% of the slots (rest poisoned)."""
    cache = _new_cache(num_layers, num_pages, framework)
    image = np.full(cache.nbytes, POISON_BYTE, np.uint8)
    written = []
    for layer in range(num_layers):
        slots = np.flatnonzero(rng.random(num_pages * 64) < 0.7).astype(np.int64)
        c = random_bf16(rng, (slots.size, 512), spread=6)
        k = random_bf16(rng, (slots.size, 64), spread=6)
        ref.write_tokens(image, num_pages, layer, slots, *ref.quantize_kv(c, k))
        written.append(slots)
    upload(cache, image)
    return cache, image, written


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fetch_dequant_matches_reference(rng: np.random.Generator, framework: str) -> None:
    num_layers, num_pages, layer = 2, 5, 1
    cache, image, written = _filled_cache(rng, num_layers, num_pages, framework)
    capacity = num_pages * 64
    slots = np.concatenate(
        [
            rng.choice(written[layer], 200),  # written (a slot may repeat)
            rng.integers(0, capacity, 30),  # some unwritten: NaN bytes -> NaN
            np.array([-1, -(2**40), capacity, capacity + 1, 2**40], np.int64),
        ]
    ).astype(np.int64)
    rng.shuffle(slots)
    want_c, want_k = ref.fetch_dequant(image, num_pages, layer, slots)
    if framework == "torch":  # row-strided, poisoned outputs
        c_wide, k_wide = nan_torch((slots.size, 600)), nan_torch((slots.size, 100))
        c_out, k_out = c_wide[:, :512], k_wide[:, 20:84]
        got_c, got_k = cache.fetch_dequant(
            layer, to_device(slots, framework), c_kv=c_out, k_pe=k_out
        )
        assert got_c is c_out and got_k is k_out
        synchronize()
        pad_c = to_numpy(c_wide)[:, 512:].astype(np.float32)
        pad_k = np.concatenate([to_numpy(k_wide)[:, :20], to_numpy(k_wide)[:, 84:]], axis=1)
        assert np.all(np.isnan(pad_c)) and np.all(np.isnan(pad_k.astype(np.float32))), (
            "fetch_dequant wrote outside its rows"
        )
    else:
        got_c, got_k = cache.fetch_dequant(layer, to_device(slots, framework))
        synchronize()
    got_c, got_k = to_numpy(got_c, BF16), to_numpy(got_k, BF16)
    assert_bf16_equal(got_c, want_c, f"fetch_dequant c_kv ({framework})")
    assert_bf16_equal(got_k, want_k, f"fetch_dequant k_pe ({framework})")
    neg = slots < 0
    assert np.all(got_c[neg].view(np.uint16) & 0x7FFF == 0), "negative slot must give zeros"
    oob = slots >= capacity
    assert np.all(np.isnan(got_c[oob].astype(np.float32)))
    assert np.all(np.isnan(got_k[oob].astype(np.float32)))


def test_fetch_dequant_zero_tokens(rng: np.random.Generator) -> None:
    cache = _new_cache(1, 2, "torch")
    c, k = cache.fetch_dequant(0, to_torch(np.zeros(0, np.int64)))
    assert tuple(c.shape) == (0, 512) and tuple(k.shape) == (0, 64)
    assert np.all(download(cache) == POISON_BYTE)


def test_append_then_fetch_round_trip(rng: np.random.Generator) -> None:
    num_pages = 4
    cache = _new_cache(2, num_pages, "torch")
    n = 200
    slots = rng.permutation(num_pages * 64)[:n].astype(np.int64)
    c, k = random_bf16(rng, (n, 512), spread=8), random_bf16(rng, (n, 64), spread=8)
    slots_dev = to_torch(slots)
    cache.append(1, to_torch(c), to_torch(k), slots_dev)
    got_c, got_k = cache.fetch_dequant(1, slots_dev)
    synchronize()
    want_c, want_k = ref.dequantize(*ref.quantize_kv(c, k))
    assert_bf16_equal(to_numpy(got_c, BF16), want_c, "round trip c_kv")
    assert_bf16_equal(to_numpy(got_k, BF16), want_k, "round trip k_pe")
    err = ref.rel_l2(to_numpy(got_c, BF16), c)
    assert err < 0.04, f"FP8 round trip rel L2 {err:.4f}"


def test_cache_properties_and_lifetime() -> None:
    num_layers, num_pages = 3, 7
    buffer = to_torch(np.zeros(num_layers * num_pages * ref.PAGE_BYTES + 512, np.uint8))
    with snapmla.KVCache(num_layers, num_pages, buffer=buffer) as cache:
        assert cache.num_layers == num_layers and cache.num_pages == num_pages
        assert cache.page_size == 64 and cache.capacity == num_pages * 64
        assert cache.layer_bytes == num_pages * ref.PAGE_BYTES
        assert cache.nbytes == num_layers * num_pages * ref.PAGE_BYTES
        assert cache.data_ptr == buffer.data_ptr()
        assert cache.device == buffer.device.index
        assert cache.buffer is buffer
    assert cache.closed
    cache.close()  # idempotent
    with pytest.raises(snapmla.SnapMLAError):
        cache.append(0, buffer, buffer, buffer)
    own = snapmla.KVCache(1, 2)
    assert own.nbytes == 2 * ref.PAGE_BYTES and own.buffer is not None
    own.close()
