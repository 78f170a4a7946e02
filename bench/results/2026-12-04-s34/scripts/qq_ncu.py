"""Q-quant kernel alone for ncu: one and two terms at 128 rows (8 tokens x 16 heads)."""
import torch
import snapmla
q = torch.randn(8, 16, 576, device="cuda").to(torch.bfloat16)
def outs(two):
    fp8 = lambda: torch.empty(8, 16, 512, dtype=torch.float8_e4m3fn, device="cuda")
    f32 = lambda: torch.empty(8, 16, device="cuda")
    rope = torch.empty(8, 16, 64, dtype=torch.bfloat16, device="cuda")
    return (fp8(), rope, f32()) + ((fp8(), f32()) if two else ())
one, two = outs(False), outs(True)
for _ in range(3):
    snapmla.quantize_q(q, out=one)
    snapmla.quantize_q(q, out=two, precision="fp8x2")
torch.cuda.synchronize()
