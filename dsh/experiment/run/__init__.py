"""Running the experiment: the presets (:mod:`.presets`), evaluation (:mod:`.evaluate`), the pipeline of every preset
(:mod:`.pipeline`) and its claim on its folders (:mod:`.folders`), the check probe (:mod:`.check_probe`), the gradient
attribution studies (:mod:`.attribution_study`), and the one-command GPU run with its offline bundle
(:mod:`.gpu_small`, :mod:`.gpu_bundle`)."""
