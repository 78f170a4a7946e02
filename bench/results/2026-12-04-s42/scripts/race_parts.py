# session 42: one decode (one term) at 8x1x32x4096 with the plan's num_sm_parts from argv[1],
# for compute-sanitizer racecheck
import sys, torch, snapmla
b, s_q, h, ctx = (int(x) for x in sys.argv[2].split("x")) if len(sys.argv) > 2 else (8, 1, 32, 4096)
pages = b * ctx // 64
cache = snapmla.KVCache(num_layers=1, num_pages=pages)
ckv = torch.randn(pages * 64, 512, device="cuda").bfloat16()
kpe = torch.randn(pages * 64, 64, device="cuda").bfloat16()
cache.append(0, ckv, kpe, torch.arange(pages * 64, device="cuda"))
bt = torch.arange(pages, dtype=torch.int32, device="cuda").view(b, -1)
sl = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
q = torch.randn(b, s_q, h, 576, device="cuda").bfloat16()
plan = snapmla.DecodePlan(sl, num_heads=h, q_len=s_q, max_pages=ctx // 64,
                          num_sm_parts=int(sys.argv[1]))
out, lse = snapmla.decode(cache, 0, q, bt, sl, plan, softmax_scale=192**-0.5, causal=s_q > 1)
torch.cuda.synchronize()
print("parts", sys.argv[1], "ok", flush=True)
