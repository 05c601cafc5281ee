import time, torch, torch.nn.functional as F, flashcore
from triton.testing import do_bench
torch.manual_seed(0)
dev = "cuda"
def eager_us(f, n=1000):
    for _ in range(50): f()
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): f()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - t) / n * 1e6)
    return sorted(best)[2]
rows = []
for (B, H, S, D) in [(2, 8, 512, 64), (4, 16, 2048, 128)]:
    q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.float16) for _ in range(3))
    forms = {"4d": (q, k, v), "5d": tuple(t.unsqueeze(0) for t in (q, k, v)),
             "3d": tuple(t.flatten(0, 1) for t in (q, k, v)),
             "kv_batch1": (q, k[:1], v[:1])}
    for name, (a, b, c) in forms.items():
        fc = lambda: flashcore.attention(a, b, c)
        sd = lambda: F.scaled_dot_product_attention(a, b, c)
        ok = (fc().float() - sd().float()).abs().max().item()
        r = dict(shape=(B, H, S, D), form=name, fc_us=do_bench(fc, warmup=25, rep=200, return_mode="median") * 1e3,
                 sdpa_us=do_bench(sd, warmup=25, rep=200, return_mode="median") * 1e3,
                 fc_eager_us=eager_us(fc), sdpa_eager_us=eager_us(sd), maxdiff=ok)
        rows.append(r); print(r, flush=True)
