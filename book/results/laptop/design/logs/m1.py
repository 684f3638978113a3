import sys, time, json, torch
torch.set_num_threads(2)
from dsh import laptop as L, laptop_task as lt
from dsh.pretrain import PretrainConfig
from dsh.tiny import TinyConfig
tokens=int(sys.argv[1]); d=int(sys.argv[2]); layers=int(sys.argv[3]); out=sys.argv[4]
spec=L.BaseSpec(model=TinyConfig(d_model=d, layers=layers, heads=4, ffn=3*d), train=PretrainConfig(tokens=tokens, save_every=100000, tokens_per_batch=int(sys.argv[5]), lr=float(sys.argv[6]), warmup_steps=int(sys.argv[7])), n_examples=60000, check_fraction=float(sys.argv[8]))
t=time.time()
prov=L.build_base(out, spec)
print("train", prov["train"], "wall", time.time()-t, flush=True)
from dsh.models import load
m,tok=L_m=load(out)
for T in (0.0,1.0):
    t=time.time(); r=L.base_report(m,tok,n_per_level=100,temperature=T); print("T",T,json.dumps(r), "eval s", round(time.time()-t,1), flush=True)
