import torch
from dsh import presets
from dsh.train import build_dataset
from dsh.models import load
from dsh.pretrain import encode, collate
cfg = presets.resolve("sft_reflection","laptop",model="dsh/assets/laptop-base",output_dir="/tmp/x", n_train=256)
recs = build_dataset(cfg)
m,tok = load(__import__("sys").argv[1])
rows = encode(tok, [(r["prompt"][0]["content"], r["completion"][0]["content"]) for r in recs])
x,att,lab = collate(rows, list(range(256)), tok.pad_token_id)
with torch.no_grad(): logits = m(input_ids=x,attention_mask=att).logits
lp = torch.log_softmax(logits[:, :-1].float(), -1)
tgt = lab[:, 1:]
mask = tgt != -100
nll = -lp.gather(-1, tgt.clamp(min=0)[..., None])[..., 0]
for lo,hi in [(0,60),(60,120),(120,200),(200,300),(300,500)]:
    sel = mask.clone(); sel[:, :lo]=False; sel[:, hi:]=False
    print(lo,hi, "mean nll", (nll*sel).sum().item()/max(1,sel.sum().item()), "n", sel.sum().item())
# by first-attempt vs rest: tokens before first "The product is"
