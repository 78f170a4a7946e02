"""The contract's model with a P block of 64, 128 or 256 tokens: error against exact attention
on the workload layers (float64 emulation, snapmla.accuracy.attention_fp8)."""
import json, sys, time
import numpy as np
import snapmla.accuracy as acc
import snapmla.workload as wl
import snapmla.reference as ref

heads_list = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [16, 128]
contexts = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [4096, 16384]
blocks = (64, 128, 256)
ops = acc.auto_backend(force_cpu=True)
rows = []
for h in heads_list:
    for li, prof in enumerate(wl.DEFAULT_LAYERS):
        full = wl.generate_layer(prof, max(contexts), h, seed=0, layer_index=li)
        for n in contexts:
            t0 = time.time()
            w = full.prefix(n)
            ex_out, _ = acc.exact(w, ops)
            errs = {}
            for b in blocks:
                acc._BLOCK = b
                out, _ = acc.emulate("ours", w, ops)
                errs[b] = ref.rel_l2(out, ex_out)
            acc._BLOCK = 64
            r = {"heads": h, "layer": prof.name, "context": n,
                 **{f"rel_l2_p{b}": errs[b] for b in blocks}}
            rows.append(r)
            print(f"h {h:3d} {prof.name:10s} {n:6d}  " + "  ".join(
                f"p{b} {errs[b]*100:.3f}% ({errs[b]/errs[64]:.4f}x)" for b in blocks),
                f"[{time.time()-t0:.0f} s]", flush=True)
for b in blocks[1:]:
    r_ = [x[f"rel_l2_p{b}"] / x["rel_l2_p64"] for x in rows]
    print(f"P block {b}: error / the 64-token block's, max {max(r_):.4f}x, "
          f"geomean {float(np.exp(np.mean(np.log(r_)))):.4f}x, min {min(r_):.4f}x")
json.dump(rows, open(sys.argv[3] if len(sys.argv) > 3 else "/tmp/pb/pblock.json", "w"), indent=1)
