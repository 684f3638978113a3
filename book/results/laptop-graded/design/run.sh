#!/usr/bin/env bash
# The graded laptop experiment on the test ladder, after its design was fixed (RULE.md, graded_design.json, both
# committed first). Run from the repository root with the environment set up (`make setup`), nothing else running
# (the pipeline records its load averages). Every step resumes: run the script again after a kill.
#   bash book/results/laptop-graded/design/run.sh [scratch folder, default /tmp/graded]
# Then: read raw responses, copy $W/results over book/results/laptop-graded (keep design/).
set -euo pipefail
W=${1:-/tmp/graded}
PY=${PY:-.venv/bin/python}
mkdir -p "$W"
log() { echo "$(date -Is) $*" | tee -a "$W/log.txt"; }
log "pipeline start"
$PY -m dsh pipeline --preset laptop-graded --results-dir "$W/results" --runs-dir "$W/runs" 2>&1 | tee -a "$W/pipeline.txt"
log "pipeline done"
