# session 42: one decode each (one term, two terms) at the shapes whose default plans leave the
# Q-quant kernel's SMs free (8x1x16x4096, 8x1x32x4096, 8x2x16x4096), for compute-sanitizer
import torch, snapmla
for b, s_q, h, ctx in [(8, 1, 16, 4096), (8, 1, 32, 4096), (8, 2, 16, 4096)]:
    pages = b * ctx // 64
    cache = snapmla.KVCache(num_layers=1, num_pages=pages)
    ckv = torch.randn(pages * 64, 512, device="cuda").bfloat16()
    kpe = torch.randn(pages * 64, 64, device="cuda").bfloat16()
    cache.append(0, ckv, kpe, torch.arange(pages * 64, device="cuda"))
    bt = torch.arange(pages, dtype=torch.int32, device="cuda").view(b, -1)
    sl = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(b, s_q, h, 576, device="cuda").bfloat16()
    for prec in ("fp8", "fp8x2"):
        plan = snapmla.DecodePlan(sl, num_heads=h, q_len=s_q, max_pages=ctx // 64, q_precision=prec)
        out, lse = snapmla.decode(cache, 0, q, bt, sl, plan, softmax_scale=192**-0.5,
                                  causal=s_q > 1)
        torch.cuda.synchronize()
        print(b, s_q, h, ctx, prec, "nan" if torch.isnan(torch.from_dlpack(out)).any() else "ok", flush=True)
        plan.close()
    cache.close()
