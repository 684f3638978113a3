"""Experiments: the presets (:mod:`~dsh.experiment.presets`), evaluation (:mod:`~dsh.experiment.evaluate`), the
pipeline of every preset, the laptop experiment included (:mod:`~dsh.experiment.pipeline`), its report
(:mod:`~dsh.experiment.report`), the paper's hyperparameters next to TRL's (:mod:`~dsh.experiment.paper_mapping`),
throughput (:mod:`~dsh.experiment.bench`), the one-command GPU run (:mod:`~dsh.experiment.gpu_small`). The top layer
below the CLI."""
