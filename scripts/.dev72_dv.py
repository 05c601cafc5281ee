import torch, torch.nn.functional as F, flashcore
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench
torch.manual_seed(0)
B = {2048: 8, 4096: 4}
for S in (2048, 4096):
    for causal in (False, True):
        q, k = (torch.randn(B[S], 16, S, 192, device="cuda", dtype=torch.float16) for _ in range(2))
        v = torch.randn(B[S], 16, S, 128, device="cuda", dtype=torch.float16)
        flops = 2 * B[S] * 16 * S * S * (192 + 128) / (2 if causal else 1)
        impls = {"fc": lambda: flashcore.attention(q, k, v, is_causal=causal)}
        for name, be in (("sdpa-default", None), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def f(be=be):
                if be is None:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            impls[name] = f
        ref = impls["sdpa-default"]().float()
        row = {}
        for name, f in impls.items():
            try:
                d = (f().float() - ref).abs().max().item()
                us = do_bench(f, warmup=25, rep=200, return_mode="median") * 1e3
                row[name] = (round(us, 1), round(flops / us / 1e6, 1), round(d, 5))
            except Exception as e:
                row[name] = repr(e)[:80]
        # forward + backward
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        go = torch.randn(B[S], 16, S, 128, device="cuda", dtype=torch.float16)
        for name, fn in (("fc fwd+bwd", lambda: flashcore.attention(qg, kg, vg, is_causal=causal)),
                         ("sdpa-default fwd+bwd", lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal))):
            def step(fn=fn):
                torch.autograd.grad(fn(), (qg, kg, vg), go)
            try:
                us = do_bench(step, warmup=10, rep=100, return_mode="median") * 1e3
                row[name] = (round(us, 1), round(3.5 * flops / us / 1e6, 1))
            except Exception as e:
                row[name] = repr(e)[:80]
        print(f"S={S} B={B[S]} H=16 D=192 Dv=128 causal={causal}", row, flush=True)
