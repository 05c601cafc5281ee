import subprocess, sys
code = """
import torch, torch.nn.functional as F
q = torch.randn(%s, device='cuda', dtype=torch.float16); k = torch.randn(%s, device='cuda', dtype=torch.float16)
print(F.scaled_dot_product_attention(q, k, k).shape)
"""
for qs, ks in (("0, 3, 4, 5, 64", "1, 3, 4, 7, 64"), ("2, 0, 5, 64", "2, 0, 7, 64"), ("3, 4, 5, 64", "4, 0, 64"),
               ("0, 3, 4, 1, 64", "1, 3, 4, 1, 64"), ("2, 0, 1, 64", "2, 0, 1, 64"), ("3, 4, 1, 64", "4, 0, 64")):
    r = subprocess.run([sys.executable, "-c", code % (qs, ks)], capture_output=True, text=True)
    print(f"q ({qs}) k ({ks}): rc {r.returncode} {r.stdout.strip()} {r.stderr.strip()[-200:]}")
