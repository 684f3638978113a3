"""The sampling kernel's tokens and log-probabilities at a2a4553 (before the vector loop of 0326b27), at 0326b27 and
at this checkout, on the same 400 x 256 rows of random logits (68 tokens, T = 1, random stream keys). The two old
sources were built as the kernels are (gcc 12.2, -O3 -march=native -ffast-math -fopenmp, -lmvec -lm):

    git show a2a4553:dsh/llm/cpu_kernels.c > /tmp/s6/k_a2a.c; git show 0326b27:dsh/llm/cpu_kernels.c > /tmp/s6/k_032.c
    gcc -O3 -march=native -ffast-math -fopenmp -shared -fPIC /tmp/s6/k_a2a.c -o /tmp/s6/k_a2a.so -lmvec -lm  (same for k_032)
"""
import ctypes, torch
from dsh.llm import kernels
P, I, F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
libs = {}
for n in ("/tmp/s6/k_a2a.so", "/tmp/s6/k_032.so"):
    l = ctypes.CDLL(n); l.sample_tokens.argtypes = [P, P, P, F, ctypes.c_int, P, P, I, I]; libs[n] = l
libs["HEAD"] = kernels.load()
g = torch.Generator()
B, V, R = 256, 68, 400
res = {}
for n, lib in libs.items():
    g.manual_seed(0); toks = []; lps = []
    for r in range(R):
        logits = torch.randn(B, V, generator=g) * 3
        key = torch.randint(0, 2**31 - 1, (B,), generator=g); step = torch.full((B,), r, dtype=torch.int64)
        out = torch.empty(B, dtype=torch.int64); logp = torch.empty(B)
        lib.sample_tokens(logits.data_ptr(), key.data_ptr(), step.data_ptr(), 1.0, 0, out.data_ptr(), logp.data_ptr(), B, V)
        toks.append(out.clone()); lps.append(logp.clone())
    res[n] = (torch.cat(toks), torch.cat(lps))
a = res["/tmp/s6/k_a2a.so"]
for n in list(res)[1:]:
    t, l = res[n]
    same = t == a[0]
    print(n, "draws", len(t), "tokens differ", int((~same).sum()), "logp differ where token same", int(((l != a[1]) & same).sum()),
          "max |dlogp|", float((l - a[1])[same].abs().max()))
