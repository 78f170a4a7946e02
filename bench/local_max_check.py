"""The softmax against the block's own row maximum (SNAPMLA_SEESAW_LOCAL_MAX, kernel.cuh) against
the contract's block step, emulated in fp32 with numpy (CPU): the P8 codes and the published
statistics (m, sigma, l, gamma) of both forms on random 64-token rows, including blocks far
below the running maximum (sigma at its floor, c = 0), half-invisible and invisible rows.
Session 20: 0 of 1,280,000 P8 codes differ; the statistics agree within 2.6e-6 relative.
(numpy's exp2, not the MUFU's: the identity, not the kernel, is what this checks.)

    python bench/local_max_check.py
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
SHIFT, UNSHIFT = F32(24), F32(2.0**-24)  # the kernel's exp2_shifted
FLOOR = F32(2.0**-64)  # kMinProbScale


def block_step(z, ks, m_prev, sig_prev, l_prev, local: bool):
    """One row's block step (log2-domain logits z, V scales ks): P8 and (m, sigma, l, gamma)."""
    mx = F32(z.max())
    m_new = F32(max(m_prev, mx))
    m_use = F32(0) if m_new == -np.inf else m_new
    if local:  # against the block's maximum, then scaled by c = 2^(mx - m_new)
        base = F32(0) if mx == -np.inf else mx
        c = F32(0) if mx == -np.inf else F32(np.exp2(F32(mx - m_use)))
    else:
        base, c = m_use, F32(1)
    ex = np.exp2((z + SHIFT - base).astype(F32)).astype(F32)
    pp = (ex * (ks * UNSHIFT)).astype(F32)
    pp[z == -np.inf] = 0
    e_sum = F32(ex.sum(dtype=F32) * UNSHIFT) * c
    p_max = F32(pp.max()) * c
    sig = F32(max(p_max / F32(448), FLOOR))
    inv = F32(1) / sig
    gamma = F32(np.exp2(F32(m_prev - m_use))) * (sig_prev * inv)
    l = F32(l_prev * gamma + e_sum * inv)
    p8 = (pp * (inv * c)).astype(ml_dtypes.float8_e4m3fn).astype(F32)
    return p8, (m_new, sig, l, gamma)


def main() -> None:
    rng = np.random.default_rng(0)
    differ = total = 0
    worst = 0.0
    for trial in range(20000):
        z = rng.normal(0, 4, 64).astype(F32)
        kind = trial % 5
        if kind == 1:
            z -= F32(rng.uniform(20, 200))  # a block far below the running maximum
        elif kind == 2:
            z[rng.random(64) < 0.5] = -np.inf
        elif kind == 3:
            z[:] = -np.inf
        ks = np.exp2(rng.uniform(-3, 3, 64)).astype(F32)
        m_prev = F32(rng.normal(0, 4)) if trial % 7 else F32(-np.inf)
        a, stats_a = block_step(z, ks, m_prev, F32(0.01), F32(3.0), local=False)
        b, stats_b = block_step(z, ks, m_prev, F32(0.01), F32(3.0), local=True)
        total += a.size
        differ += int((a != b).sum())
        for x, y in zip(stats_a, stats_b):
            if np.isfinite(x) and x != 0:
                worst = max(worst, abs(float(y) / float(x) - 1))
            else:
                assert x == y or (np.isnan(x) and np.isnan(y)), (trial, stats_a, stats_b)
    print(f"P8 codes that differ: {differ} of {total}; statistics within {worst:.2g} relative")


if __name__ == "__main__":
    main()
