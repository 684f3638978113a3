"""The attribution study on the wide-ladder model of wide_ladder_derisk.py (issue 31), written to
wide_ladder_study.json.gz beside this file: SFT (reflection) fine-tuned from the shipped base on 1x1 ... 1x10 in both
orders, against the shipped base (its reference), on its own samples at temperature 1 over 1x1 ... 1x10 (where its
per-level median attempts span more than 5x; at the rollouts' temperature 2 they do not), 12 questions a level, 8
samples each, one round (at temperature 1 few groups carry a reward signal: the surrogate reward's fit rests on few
trajectories; the KL, SFT and DFT terms need none). A design measurement beside the pipeline's studies, not one of
them. Run from the repository root with the scratch folder wide_ladder_derisk.py trained into:

    python book/results/laptop/design/wide_ladder_study.py <scratch_dir>
"""

import json
import sys
from pathlib import Path

from dsh.experiment.run.attribution_study import StudySettings, run_study
from dsh.llm.models import weights_digest
from dsh.training.laptop_base import SHIPPED_BASE

scratch = Path(sys.argv[1])
model = scratch / "sft_reflection_wide10-s0" / "final"
derisk = json.loads((Path(__file__).parent / "wide_ladder_derisk.json").read_text())["1x1-1x10"]
settings = StudySettings(levels=tuple(f"1x{n}" for n in range(1, 11)), temperature=1.0, min_signal=0)
if weights_digest(model) != derisk["weights"]:
    raise SystemExit("the model in the scratch folder is not the one wide_ladder_derisk.json measured")
run_study(str(model), str(SHIPPED_BASE), Path(__file__).with_suffix(".json.gz"), settings, progress=True,
          roots={scratch: "<scratch>", SHIPPED_BASE.parent: "<dsh assets>"})
