import sys, json, time
sys.argv = [sys.argv[0], "grpo"] + sys.argv[1:]
exec(open("/tmp/s1.py").read())
rows=[json.loads(l) for l in open(out+"/metrics.jsonl")]
print("REWARD", [(r["step"], round(r.get("reward",0),3), round(r.get("frac_reward_zero_std",0),2), round(r.get("kl",0) or 0,5), round(r.get("completions/mean_length",0))) for r in rows if "reward" in r][::4])
