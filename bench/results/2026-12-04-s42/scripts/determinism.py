# session 42: a real race on the seesaw kernel's row statistics would show as outputs that change
# from run to run: 200 decodes at plans with long parts (racecheck flags those), bit-compared
import torch, snapmla
for b, s_q, h, ctx, parts in [(8, 1, 32, 4096, 44), (8, 1, 16, 4096, 22), (8, 2, 16, 4096, 44)]:
    pages = b * ctx // 64
    cache = snapmla.KVCache(num_layers=1, num_pages=pages)
    ckv = torch.randn(pages * 64, 512, device="cuda").bfloat16()
    kpe = torch.randn(pages * 64, 64, device="cuda").bfloat16()
    cache.append(0, ckv, kpe, torch.arange(pages * 64, device="cuda"))
    bt = torch.arange(pages, dtype=torch.int32, device="cuda").view(b, -1)
    sl = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(b, s_q, h, 576, device="cuda").bfloat16()
    for prec in ("fp8", "fp8x2"):
        plan = snapmla.DecodePlan(sl, num_heads=h, q_len=s_q, max_pages=ctx // 64,
                                  num_sm_parts=parts, q_precision=prec)
        out = torch.empty(b, s_q, h, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(b, h, s_q, dtype=torch.float32, device="cuda")
        snapmla.decode(cache, 0, q, bt, sl, plan, softmax_scale=192**-0.5, causal=s_q > 1, out=out, lse=lse)
        ref, ref_lse = out.clone(), lse.clone()
        diff = 0
        for _ in range(200):
            snapmla.decode(cache, 0, q, bt, sl, plan, softmax_scale=192**-0.5, causal=s_q > 1, out=out, lse=lse)
            diff += int(not (torch.equal(out.view(torch.int16), ref.view(torch.int16)) and torch.equal(lse, ref_lse)))
        torch.cuda.synchronize()
        print(b, s_q, h, ctx, "parts", parts, prec, "runs differing from the first:", diff, flush=True)
        plan.close()
    cache.close()
