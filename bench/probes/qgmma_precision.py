"""What Hopper's FP8 wgmma accumulation does to the contract's decode (CPU emulation).

Emulates the FP8 tensor cores' accumulation as public measurements describe it (DeepSeek-V3
technical report, section 3.5.2; the SageAttention2 paper): in each k = 32 step the 32 products
and the incoming accumulator are aligned to the largest exponent and only the top ``bits`` bits
of each are kept (the products cut toward -inf), the incoming accumulator is cut to ``bits``
mantissa bits (toward zero), and so is the result. ``bits`` is 13 or 14 in those reports. On
the H200 (``qgmma_probe.cu``), 13 bits with the products cut toward zero reproduce 80-89% of
long chains' outputs bit for bit, and cut toward -inf none. This script then runs the
contract's softmax on the emulated logits (and, separately, on an emulated PV) and reports the
relative L2 distance of the BF16 output from the model.

QK schemes, by how many k = 32 steps share one accumulator before an fp32 add: ``chain4`` (four
per 128-channel chunk), ``chain8`` (the seesaw kernel: channels 0-255 and 256-511), ``chain2``,
``k32`` (a zeroed accumulator per step) and ``chain16`` (all sixteen). RoPE (BF16) is taken as
exact. PV: per 64-token block, two chained k = 32 steps from zero, added to O in fp32, as the
seesaw kernel issues it.

``--two-term``: per layer of ``snapmla.workload``, the two-term query's error against exact
attention in the contract's model and under the seesaw kernel's accumulation (the QK of the high
and low rows each as one of the schemes, z = fmaf(rho, lo, hi); PV as the kernel issues it),
beside the BF16-query diagnostic.

Run: ``PYTHONPATH=python python3 bench/probes/qgmma_precision.py [--bits 13 14]``; a minute or
two on a CPU.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

from snapmla import reference as ref

BF16 = ml_dtypes.bfloat16
SM_SCALE = 192**-0.5


def _exponent(x: np.ndarray) -> np.ndarray:
    """floor(log2 |x|); a very negative number for 0."""
    _, e = np.frexp(np.abs(x))
    return np.where(x == 0, -(10**6), e - 1)


def _truncate(x: np.ndarray, bits: int) -> np.ndarray:
    """x toward zero to `bits` bits after the leading one."""
    ulp = np.exp2(np.maximum(_exponent(x), -1000) - bits)
    return np.where(x == 0, 0.0, np.sign(x) * np.floor(np.abs(x) / ulp) * ulp)


def qgmma_step(d: np.ndarray, a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """One emulated k = 32 step: d [...] + a [..., 32] . b [..., 32] (exact FP8 values)."""
    p = a * b  # exact in float64
    e = np.maximum(_exponent(p).max(axis=-1), _exponent(d))
    grid = np.exp2(np.maximum(e, -1000) - bits)[..., None]
    return _truncate(_truncate(d, bits) + (np.floor(p / grid) * grid).sum(axis=-1), bits)


def logits(q8, c8, qr, kr, scheme: str, bits: int) -> np.ndarray:
    """S [R, T] of FP8 query codes q8 [R, 512] and key codes c8 [T, 512] (+ exact RoPE)."""
    rope = qr @ kr.T
    if scheme == "exact":
        return q8 @ c8.T + rope
    r, t = q8.shape[0], c8.shape[0]
    a = np.broadcast_to(q8[:, None, :], (r, t, 512)).reshape(r, t, 16, 32)
    b = np.broadcast_to(c8[None, :, :], (r, t, 512)).reshape(r, t, 16, 32)

    def chain(steps):
        d = np.zeros((r, t))
        for g in steps:
            d = qgmma_step(d, a[:, :, g], b[:, :, g], bits)
        return d

    if scheme == "chain4":
        parts = [chain(range(4 * c, 4 * c + 4)) for c in range(4)]
        return (parts[0] + parts[1]) + (parts[2] + parts[3]) + rope
    if scheme == "chain8":
        return chain(range(8)) + chain(range(8, 16)) + rope
    if scheme == "chain2":
        return sum(chain([2 * g, 2 * g + 1]) for g in range(8)) + rope
    if scheme == "k32":
        return sum(chain([g]) for g in range(16)) + rope
    if scheme == "chain16":
        return chain(range(16)) + rope
    raise ValueError(scheme)


def _bf16(x: np.ndarray) -> np.ndarray:
    return x.astype(BF16).astype(np.float64)


def _f64(x) -> np.ndarray:
    """FP8 / BF16 / fp32 values as float64 (exact)."""
    return np.asarray(x).astype(np.float32).astype(np.float64)


def random_case(rng, n: int, h: int, std: float = 0.5, spread: float = 1.0):
    """The GPU tests' random data (randn * std, rows scaled by 2^U(-spread, spread)), quantized
    by the contract: (q8, qr, q_scale, c8, kr, k_scale) as float64."""

    def sample(shape):
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(std)
        x *= np.exp2(rng.uniform(-spread, spread, shape[:-1] + (1,))).astype(np.float32)
        return x.astype(BF16)

    content, rope, scale = ref.quantize_kv(sample((n, 512)), sample((n, 64)))
    q8, qr, sq = ref.quantize_q(sample((1, 1, h, 576)))
    return (
        _f64(q8[0, 0]),
        _f64(qr[0, 0]),
        _f64(sq[0]).reshape(h),
        _f64(content),
        _f64(rope),
        _f64(scale),
    )


def decode(case, scheme: str, bits: int, segments=None) -> np.ndarray:
    q8, qr, sq, c8, kr, s = case
    z = logits(q8, qr=qr, c8=c8, kr=kr, scheme=scheme, bits=bits)
    z = z * (sq * np.float32(SM_SCALE))[:, None] * s[None, :]
    if segments is None:
        return ref.attend_logits(z, s, c8)[0]
    parts = [ref.attend_logits(z[:, a:b], s[a:b], c8[a:b]) for a, b in segments]
    return ref.merge_lse([p[0] for p in parts], [p[1] for p in parts])[0]


def emulated_pv(p8: np.ndarray, values: np.ndarray, bits: int) -> np.ndarray:
    """One block's P8 [R, k] V [k, 512] as the seesaw kernel issues it: chained emulated k = 32
    QGMMA steps from zero (tokens padded to a multiple of 32)."""
    rows, pad = p8.shape[0], (-p8.shape[1]) % 32
    pp, vv = np.pad(p8, ((0, 0), (0, pad))), np.pad(values, ((0, pad), (0, 0)))
    k = pp.shape[1]
    a = np.broadcast_to(pp[:, None, :], (rows, 512, k)).reshape(rows, 512, -1, 32)
    b = np.broadcast_to(vv.T[None, :, :], (rows, 512, k)).reshape(rows, 512, -1, 32)
    d = np.zeros((rows, 512))
    for step in range(a.shape[2]):
        d = qgmma_step(d, a[:, :, step], b[:, :, step], bits)
    return d


def workload_errors(context: int, heads: int, bits: int, seed: int = 0) -> list[tuple]:
    """Per layer of snapmla.workload: relative L2 against exact attention of the contract's
    model (exact S) and of the emulated QK schemes, all with the contract's FP8 P and PV."""
    from snapmla import workload as wl

    rows = []
    for w in wl.generate(context, heads, seed=seed):
        content, rope, scale = ref.quantize_kv(w.c_kv, w.k_pe)
        q8, qr, sq = ref.quantize_q(w.q)
        case = (
            _f64(q8[0, 0]),
            _f64(qr[0, 0]),
            _f64(sq[0, 0]).reshape(heads),
            _f64(content),
            _f64(rope),
            _f64(scale),
        )
        exact, _ = ref.exact_attention(w.q, [w.c_kv], [w.k_pe], [context], w.softmax_scale, True)
        want = exact[0, 0]
        errs = []
        for scheme in ("exact", "chain4", "k32"):
            q8_, qr_, sq_, c8, kr, s = case
            z = np.concatenate(  # token chunks bound the emulation's memory
                [
                    logits(q8_, c8[t : t + 512], qr_, kr[t : t + 512], scheme, bits)
                    for t in range(0, context, 512)
                ],
                axis=1,
            )
            z = z * (sq_ * np.float32(w.softmax_scale))[:, None] * s[None, :]
            errs.append(ref.rel_l2(_bf16(ref.attend_logits(z, s, c8)[0]), want))
        rows.append((w.profile.name, *errs))
    return rows


def two_term_errors(context: int, heads: int, bits: int, seed: int = 0) -> list[tuple]:
    """Per layer of snapmla.workload, relative L2 against exact attention (every configuration
    with the contract's FP8 KV and FP8 P): the BF16-query diagnostic (exact S, exact PV); the
    one-term query's model and its seesaw-kernel emulation (chain8 QK, emulated PV); the
    two-term query's model and its emulations with chain8 and k32 QK (emulated PV)."""
    from snapmla import workload as wl

    rows = []
    for w in wl.generate(context, heads, seed=seed):
        content, rope, scale = ref.quantize_kv(w.c_kv, w.k_pe)
        c8, kr, s = _f64(content), _f64(rope), _f64(scale)
        exact, _ = ref.exact_attention(w.q, [w.c_kv], [w.k_pe], [context], w.softmax_scale, True)
        want = exact[0, 0]
        sm = np.float32(w.softmax_scale)
        q_hi, qr, s1, q_lo, s2 = (_f64(x[0, 0]) for x in ref.quantize_q2(w.q))
        s1, s2 = s1.reshape(heads), s2.reshape(heads)
        rho = (s2.astype(np.float32) / s1.astype(np.float32)).astype(np.float64)  # fp32 IEEE
        zero_rope = np.zeros_like(qr)
        pv = lambda p8, v: emulated_pv(p8, v, bits)

        def qk(q8, rq, scheme):  # raw S [heads, context], in 512-token chunks (memory)
            return np.concatenate(
                [
                    logits(q8, c8[t : t + 512], rq, kr[t : t + 512], scheme, bits)
                    for t in range(0, context, 512)
                ],
                axis=1,
            )

        def out(z_raw, row_scale, emulate_pv):
            z = z_raw * (row_scale * sm)[:, None] * s[None, :]
            got = ref.attend_logits(z, s, c8, pv=pv if emulate_pv else None)[0]
            return ref.rel_l2(_bf16(got), want)

        qb = _f64(np.asarray(w.q[0, 0]))  # the BF16 query, unquantized
        z_bf16 = qb[:, :512] @ (c8 * 1.0).T + qb[:, 512:] @ kr.T
        e_bf16 = out(z_bf16, np.ones(heads), False)
        e_one_model = out(qk(q_hi, qr, "exact"), s1, False)
        e_one_kernel = out(qk(q_hi, qr, "chain8"), s1, True)
        errs = [e_bf16, e_one_model, e_one_kernel]
        for scheme, emulate_pv in (
            ("exact", False),
            ("chain8", True),
            ("chain4", True),
            ("chain2", True),
            ("k32", True),
        ):
            hi = qk(q_hi, qr, scheme)
            lo = qk(q_lo, zero_rope, scheme)
            z_raw = (hi + rho[:, None] * lo).astype(np.float32).astype(np.float64)  # fmaf
            errs.append(out(z_raw, s1, emulate_pv))
        rows.append((w.profile.name, *errs))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bits", type=int, nargs="+", default=[13, 14])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--workload-context",
        type=int,
        default=2048,
        help="context of the snapmla.workload comparison (0: skip it)",
    )
    ap.add_argument(
        "--two-term",
        action="store_true",
        help="only the two-term query's comparison, on snapmla.workload",
    )
    args = ap.parse_args()
    np.seterr(all="ignore")
    if args.two_term:
        n = args.workload_context
        for bits in args.bits:
            print(
                f"accumulation kept to {bits} bits; snapmla.workload, {n} tokens, 16 heads: "
                "relative L2 against exact attention (x: / the BF16-query diagnostic)"
            )
            print(
                f"    {'layer':12s} {'bf16-q':>9s} {'1t model':>9s} {'1t kernel':>14s} "
                f"{'2t model':>14s} {'2t chain8':>14s} {'2t chain4':>14s} {'2t chain2':>14s} "
                f"{'2t k32':>14s}"
            )
            for name, eb, e1m, *es in two_term_errors(n, 16, bits, args.seed):
                cells = "".join(f" {e:.2e} {e / eb:4.2f}x" for e in es)
                print(f"    {name:12s} {eb:.2e} {e1m:.2e}{cells}", flush=True)
        return
    shapes = [
        (64, 1, False),
        (64, 16, False),
        (1024, 16, False),
        (1024, 16, True),
        (1024, 128, False),
        (4096, 16, False),
    ]
    np.seterr(all="ignore")
    for bits in args.bits:
        print(f"accumulation kept to {bits} bits: relative L2 of out against the model")
        rng = np.random.default_rng(args.seed)
        for n, h, split in shapes:
            case = random_case(rng, n, h)
            segs = [(i, min(i + 64, n)) for i in range(0, n, 64)] if split else None
            want = _bf16(decode(case, "exact", bits, segs))
            got = {
                s: ref.rel_l2(_bf16(decode(case, s, bits, segs)), want)
                for s in ("chain4", "k32", "chain16")
            }
            label = f"QK, random, {n} tokens, h={h}" + (", one-block segments" if split else "")
            print(f"  {label:52s}" + "  ".join(f"{k} {v:.1e}" for k, v in got.items()), flush=True)
        rng = np.random.default_rng(args.seed + 1)
        for n, h in [(64, 1), (1024, 16), (2000, 16), (1024, 128)]:
            content = rng.integers(-2, 3, (n, 512)).astype(np.float64)
            content[:, 0] = 0
            rope = rng.integers(-2, 3, (n, 64)).astype(np.float64)
            scale = np.exp2(rng.uniform(-1, 1, n)).astype(np.float32).astype(np.float64)
            q = rng.integers(-2, 3, (h, 576)).astype(np.float64)
            q[:, 0] = 448
            z = (q[:, :512] @ content.T + q[:, 512:] @ rope.T) * np.float32(SM_SCALE) * scale
            want = _bf16(ref.attend_logits(z, scale, content)[0])
            pv = lambda p8, v: emulated_pv(p8, v, bits)
            got = _bf16(ref.attend_logits(z, scale, content, pv=pv)[0])
            label = f"PV, exact logits, {n} tokens, h={h}"
            print(f"  {label:52s}kernel PV {ref.rel_l2(got, want):.1e}", flush=True)
        if args.workload_context:
            n = args.workload_context
            print(f"  snapmla.workload, {n} tokens, 16 heads: relative L2 against exact attention")
            for name, e_model, e_c4, e_k32 in workload_errors(n, 16, bits, args.seed):
                print(
                    f"    {name:22s} model (exact S) {e_model:.2e}  chain4 {e_c4:.2e}  k32 {e_k32:.2e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
