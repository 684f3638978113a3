import torch, sys, json
from dsh import presets, laptop_task as lt, laptop as L
from dsh.train import build_dataset
from dsh.models import load
from dsh.pretrain import encode, pretrain, PretrainConfig
from dsh.parse import parse_response
lr=float(sys.argv[1]); tpb=int(sys.argv[2])
cfg = presets.resolve("sft_reflection","laptop",model="dsh/assets/laptop-base",output_dir="/tmp/x", n_train=4000)
recs = build_dataset(cfg)
m,tok = load("dsh/assets/laptop-base")
rows = encode(tok, [(r["prompt"][0]["content"], r["completion"][0]["content"]) for r in recs])
st = pretrain(m, tok, rows, "/tmp/d2work"+sys.argv[3], PretrainConfig(tokens=900_000, lr=lr, tokens_per_batch=tpb, warmup_steps=10, min_lr_fraction=0.0), progress=False)
print(st["steps"], st["final_loss_ema"], st["tokens_per_s"])
m.eval()
qs = lt.test_questions(n_per_level=50)
outs = L.complete(m, tok, [p.question for p in qs], 768, 1.0, 0)
acc={}
recs2=[]
for p,(t,_) in zip(qs,outs):
    acc.setdefault(p.level,[]).append(parse_response(t,p.a,p.b).final_answer==p.answer)
    recs2.append({"question":p.question,"answer":p.answer,"response":t,"level":p.level})
print({k: sum(v)/len(v) for k,v in acc.items()})
f=lt.faithfulness(recs2); print({k:(round(v["verdict_follows_check"],3), round(v["check_exact"],3)) for k,v in f.items()})
