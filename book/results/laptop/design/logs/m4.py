import sys, time, json, torch
from dsh import laptop as L
from dsh.pretrain import PretrainConfig
spec=L.BaseSpec(train=PretrainConfig(tokens=int(sys.argv[1]), tokens_per_batch=int(sys.argv[2]), save_every=100000), pack_length=int(sys.argv[3]))
prov=L.build_base(sys.argv[4], spec, progress=False)
print(json.dumps(prov["train"])); print(json.dumps(prov["report"]))
