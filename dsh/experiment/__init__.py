"""Experiments, the top layer below the CLI, by role: running them (:mod:`dsh.experiment.run`: presets, evaluation,
the pipeline of every preset, the check probe, the attribution studies, the one-command GPU run), reporting them
(:mod:`dsh.experiment.report`: tables, figures, verdicts, the first page's table) and benchmarking dsh's paths
(:mod:`dsh.experiment.bench`). ``report`` and ``bench`` read what ``run`` makes; ``run`` imports neither."""
