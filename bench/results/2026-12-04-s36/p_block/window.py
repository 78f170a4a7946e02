"""A windowed sticky P scale: a row keeps its sigma while a block's own max P' / 448 lies within
[sigma 2^-W, sigma]; otherwise (above, or more than W binades below) sigma becomes the block's
own, and O^T would be rescaled. Error against exact attention and how often sigma moves."""
import sys, json
import numpy as np
import snapmla.accuracy as acc
import snapmla.workload as wl
import snapmla.reference as ref
E4M3_MAX = 448.0

def attention(z, p_scale, values, W, block=64):
    r, n = z.shape
    nb = -(-n // block); pad = nb * block - n
    if pad:
        z = np.concatenate([z, np.full((r, pad), -np.inf)], 1)
        p_scale = np.concatenate([p_scale, np.zeros(pad)])
        values = np.concatenate([values, np.zeros((pad, values.shape[1]))], 0)
    zb = z.reshape(r, nb, block)
    m_blk = zb.max(axis=2); m_safe = np.where(np.isfinite(m_blk), m_blk, 0.0)
    e_blk = np.exp(zb - m_safe[..., None])
    t = e_blk * p_scale.reshape(1, nb, block)
    t_max = t.max(axis=2)
    top = m_blk.max(axis=1); top_safe = np.where(np.isfinite(top), top, 0.0)
    shift = np.exp(m_safe - top_safe[:, None])
    abs_max = t_max * shift
    ref_abs = np.empty_like(abs_max); cur = np.zeros(r); moves = 0
    for k in range(nb):
        a = abs_max[:, k]
        keep = (a <= cur) & (a >= cur * 2.0 ** -W) & (a > 0) if W is not None else (a <= cur)
        moves += int(np.sum(~keep & (a > 0)))
        cur = np.where(keep, cur, a)
        ref_abs[:, k] = cur
    ref_safe = np.where(ref_abs > 0, ref_abs, 1.0)
    p = ref.e4m3_round(t * (shift / ref_safe)[..., None] * E4M3_MAX)
    w = ref_abs / E4M3_MAX
    num = (p * w[..., None]).reshape(r, nb * block) @ values
    den = (e_blk * shift[..., None]).sum(axis=(1, 2))
    return num / den[:, None], moves / (r * nb)

ops = acc.auto_backend(force_cpu=True)
heads_list = [int(x) for x in sys.argv[1].split(",")]
contexts = [int(x) for x in sys.argv[2].split(",")]
Ws = [0, 1, 2, 3, 4, 6]
rows = []
for h in heads_list:
    for li, prof in enumerate(wl.DEFAULT_LAYERS):
        full = wl.generate_layer(prof, max(contexts), h, seed=0, layer_index=li)
        for n in contexts:
            w = full.prefix(n)
            ex_out, _ = acc.exact(w, ops)
            kv = acc.quantize_kv_scheme("ours", w.c_kv.astype(np.float64), w.k_pe.astype(np.float64), ops)
            qc, qr = acc._quantized_queries(w.q, ops, quantize=True, q_terms=1)
            z = acc._logits(qc, qr, kv, float(np.float32(w.softmax_scale)), ops)
            res = {}
            for W in Ws:
                o, mv = attention(z, kv.p_scale, kv.values, W)
                res[W] = (ref.rel_l2(o.reshape(ex_out.shape), ex_out), mv)
            base = res[0][0]
            rows.append({"heads": h, "layer": prof.name, "context": n,
                         **{f"W{W}": {"rel_l2": res[W][0], "moves": res[W][1]} for W in Ws}})
            print(f"h {h:3d} {prof.name:10s} {n:6d} " + " ".join(
                f"W{W} {res[W][0]/base:.4f}x/{res[W][1]*100:4.1f}%" for W in Ws), flush=True)
for W in Ws[1:]:
    r_ = [x[f"W{W}"]["rel_l2"] / x["W0"]["rel_l2"] for x in rows]
    mv = [x[f"W{W}"]["moves"] for x in rows]
    print(f"W {W}: error / per-block max {max(r_):.4f}x geomean {float(np.exp(np.mean(np.log(r_)))):.4f}x; "
          f"sigma moves in {min(mv)*100:.1f}-{max(mv)*100:.1f}% of (row, block)")
json.dump(rows, open(sys.argv[3], "w"), indent=1)
