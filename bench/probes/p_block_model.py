"""The contract's model with a longer P block: error against exact attention (CPU, float64).

The numerics contract quantizes P per 64-token block (one sigma and one running maximum per
page). A kernel that promoted its fp32 PV once per two pages (the promotion is ~30% of the
N = 64 kernel's time) would need a 128-token P block: a change of the contract. This runs
`snapmla.accuracy`'s vectorized model of the contract (`attention_fp8`) with its block length
set to 64, 128 and 256 tokens on the workload layers and prints each one's relative L2 error
against exact float64 attention, and its ratio to the 64-token block's.

    PYTHONPATH=python python3 bench/probes/p_block_model.py [HEADS,...] [CONTEXT,...] [OUT.json]

(defaults: 16,128 heads; 4096,16384 tokens; /tmp/p_block_model.json). Emulation only: no GPU.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import snapmla.accuracy as acc
import snapmla.reference as ref
import snapmla.workload as wl

BLOCKS = (64, 128, 256)


def main(argv: list[str]) -> int:
    heads = [int(x) for x in argv[1].split(",")] if len(argv) > 1 else [16, 128]
    contexts = [int(x) for x in argv[2].split(",")] if len(argv) > 2 else [4096, 16384]
    out_path = argv[3] if len(argv) > 3 else "/tmp/p_block_model.json"
    # the model's P block length, a module global of snapmla.accuracy (the contract's is 64)
    if getattr(acc, "_BLOCK", None) != ref.PAGE_SIZE:
        raise SystemExit("snapmla.accuracy has no 64-token _BLOCK to vary")
    ops = acc.auto_backend(force_cpu=True)
    rows = []
    for h in heads:
        for li, profile in enumerate(wl.DEFAULT_LAYERS):
            full = wl.generate_layer(profile, max(contexts), h, seed=0, layer_index=li)
            for n in contexts:
                t0 = time.time()
                w = full.prefix(n)
                exact_out, _ = acc.exact(w, ops)
                errs = {}
                for block in BLOCKS:
                    acc._BLOCK = block
                    out, _ = acc.emulate("ours", w, ops)
                    errs[block] = ref.rel_l2(out, exact_out)
                acc._BLOCK = ref.PAGE_SIZE
                rows.append(
                    {
                        "heads": h,
                        "layer": profile.name,
                        "context": n,
                        **{f"rel_l2_p{b}": errs[b] for b in BLOCKS},
                    }
                )
                print(
                    f"h {h:3d} {profile.name:10s} {n:6d}  "
                    + "  ".join(
                        f"p{b} {errs[b] * 100:.3f}% ({errs[b] / errs[64]:.4f}x)" for b in BLOCKS
                    ),
                    f"[{time.time() - t0:.0f} s]",
                    flush=True,
                )
    for block in BLOCKS[1:]:
        ratios = [r[f"rel_l2_p{block}"] / r["rel_l2_p64"] for r in rows]
        print(
            f"P block {block}: error / the 64-token block's, max {max(ratios):.4f}x, "
            f"geomean {float(np.exp(np.mean(np.log(ratios)))):.4f}x, min {min(ratios):.4f}x"
        )
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
