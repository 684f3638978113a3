#!/bin/bash
# One step of `git bisect run` (2026-12-07, on the 2-core AMD Zen 4 host): train laptop-graded's rl_verdict-s0 again
# at the worktree's commit (/tmp/s6/wt), from sft_verdict-s0 trained again at b49fa8e (its committed digest), with
# the worktree's own dsh on PYTHONPATH; exit 0 where its final weights are the committed ones, 1 where not, 125
# where the run failed. The first form of retrain_stages.py (/tmp/s6/repro.py: the same training and comparison, the
# results folder fixed to laptop-graded) did the training. Run as:
#   git worktree add --detach /tmp/s6/wt 70e8a50 && cd /tmp/s6/wt && git bisect start 70e8a50 3fb2018
#   git bisect run <this file>
cd /tmp/s6/wt
c=$(git rev-parse --short HEAD)
d=/tmp/s6/runs-b-$c; rm -rf $d; mkdir -p $d; ln -sfn /tmp/s6/runs-head/sft_verdict-s0 $d/sft_verdict-s0
PYTHONPATH=/tmp/s6/wt /work/main/.venv/bin/python /tmp/s6/repro.py $d rl_verdict-s0 > /tmp/s6/bisect-$c.log 2>&1 || exit 125
r=$(grep -c "'identical': True" /tmp/s6/bisect-$c.log)
echo "$c identical=$r $(grep -o "'got': '[^']*'" /tmp/s6/bisect-$c.log)" >> /tmp/s6/bisect.summary
rm -rf $d/rl_verdict-s0
[ "$r" = 1 ] && exit 0 || exit 1
