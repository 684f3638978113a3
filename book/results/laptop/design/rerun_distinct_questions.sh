#!/usr/bin/env bash
# Issue 34's re-run: the laptop experiment on test questions drawn without replacement.
#
# Why: the laptop ladder's test questions were drawn with replacement (7 repeats among the 100 questions of 1x2, one
# among 1x3). Drawn without (dsh.task.problems.draw_problems(distinct=True): the same stream with repeats skipped),
# 8 questions are new, and the shipped base's corpus holds all 8 (it held out the old set only), so the base is
# retrained on a corpus that holds the new set out, and every stage of the experiment is trained and measured again.
#
# Before (done on main 2026-11-26): test_problems draws with distinct=True, and dsh/assets/laptop-base is a base
# trained by that code (`python -m dsh base --out X`, defaults: ~30-38 min alone on the 2-core machine; the one
# shipped is described in base_distinct_questions.md beside this script).
# Run from the repository root with the environment set up (`make setup`), nothing else running (the pipeline
# records its load averages). Every step resumes: run the script again after a kill.
#   bash book/results/laptop/design/rerun_distinct_questions.sh [scratch folder, default /tmp/rerun34]
# Then: read raw responses of 1x2 / 1x3, copy $W/results over book/results/laptop (keep design/, attribution/ is
# rewritten below), write summary.json's provenance_note, and let the tests that compare committed results with the
# code (test_unchanged, test_findings, test_pretrain's corpus test) say what else moved.
set -euo pipefail
W=${1:-/tmp/rerun34}
PY=${PY:-.venv/bin/python}
mkdir -p "$W"
log() { echo "$(date -Is) $*" | tee -a "$W/log.txt"; }

$PY - <<'EOF'
from dsh.task.laptop_task import test_questions
qs = [(p.a, p.b) for p in test_questions()]
assert len(qs) == len(set(qs)), "test questions still drawn with replacement: switch test_problems to distinct=True"
EOF
log "test questions distinct: yes"

# the shipped base's corpus, rebuilt from its recorded spec, holds no test question in either order
$PY -m pytest -q -p no:cacheprovider tests/test_pretrain.py -k no_test_question_is_in_the_shipped_base_corpus
log "shipped base's corpus holds no test question in either order"

log "pipeline start"
$PY -m dsh pipeline --preset laptop --results-dir "$W/results" --runs-dir "$W/runs" 2>&1 | tee -a "$W/pipeline.txt"
log "pipeline done"

# the attribution studies of chapter 08: the committed set (six models, seed 0) and its two reproductions (seed 1)
$PY -m dsh attribution --results-dir "$W/results" --runs-dir "$W/runs" \
    --stages sft-s0,sft_reflection-s0,dft-s0,rl-s0,rl_beta0-s0,rl_beta0.1-s0 2>&1 | tee -a "$W/attribution.txt"
$PY -m dsh attribution --results-dir "$W/results" --runs-dir "$W/runs" --seed 1 \
    --stages sft_reflection-s0,rl-s0 2>&1 | tee -a "$W/attribution.txt"
log "all done"
