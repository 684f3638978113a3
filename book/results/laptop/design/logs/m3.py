import torch,sys,random
from dsh import laptop as L, laptop_task as lt
from dsh.models import load
m,tok=load(sys.argv[1])
T=float(sys.argv[2])
qs=lt.test_questions(n_per_level=40)
rng=random.Random(0)
ch=[lt.check_example(p,rng) for p in qs]
outs=L.complete(m,tok,[c.prompt for c in ch],140,T)
import re
stats={}
shown=0
for p,c,(t,_) in zip(qs,ch,outs):
    v_true = c.decisions[0]=="STOP"
    v = "passes" in t
    st=stats.setdefault(p.level,[0,0,0])
    st[0]+=1; st[1]+= (v==v_true); st[2]+= t.strip()==c.text
    if t.strip()!=c.text and shown<6 and p.level in ("1x3","1x5"):
        shown+=1; print(c.prompt); print(" want", c.text); print(" got ", t)
for k,(n,a,e) in stats.items(): print(k, "verdict right", a/n, "exact", e/n)
