import sys, json, time, dataclasses
from dsh import presets, laptop_task as lt
from dsh.train import train
from dsh.evaluate import evaluate
from dsh.calibration import calibrate
from dsh.files import read_jsonl
method, out = sys.argv[1], sys.argv[2]
over = dict(a.split("=",1) for a in sys.argv[3:])
over = {k: json.loads(v) for k,v in over.items()}
model = over.pop("model", "dsh/assets/laptop-base")
cfg = presets.resolve(method, "laptop", model=model, output_dir=out, **over)
t=time.time(); s = train(cfg); print("TRAIN", {k: s.get(k) for k in ("wall_s","global_step","first_loss","last_loss","tokens_per_s","real_tokens","truncation")}, flush=True)
g = out + "/gen.jsonl"
t=time.time(); evaluate(out, out=g, levels=presets.LAPTOP_EVAL_LEVELS, n_per_level=100, max_new_tokens=768, batch_size=64, progress=False); print("EVAL s", round(time.time()-t,1))
recs = read_jsonl(g)
c = calibrate(recs, n_bootstrap=0)
for lv, x in c["by_level"].items():
    print(lv, {k: (round(x[k],3) if isinstance(x[k], float) else x[k]) for k in ("observed_accuracy","p_s","p_d_given_correct","p_d_given_wrong","predicted_accuracy")})
print(json.dumps(lt.faithfulness(recs), indent=0))
