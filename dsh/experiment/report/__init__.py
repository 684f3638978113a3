"""Tables, figures and verdicts on the paper's claims, from a results folder of any preset
(:func:`dsh.experiment.run.pipeline.load_results`), by what they report: the long table (:mod:`.frame`), the trained
stages (:mod:`.stages`), the training runs (:mod:`.training`), the claims' verdicts (:mod:`.claims`), the graded
experiment's design points (:mod:`.regime`), the pipeline's time with the measured levers (:mod:`.levers`),
gradient attribution (:mod:`.attribution`) and a committed stage trained again (:mod:`.retraining`); every public
name of those modules is here, so ``report.table1(results)`` reads as one module. The first page's table is
:mod:`.findings`, a results folder from known truth :mod:`.simulated`, the paper's hyperparameters beside TRL's
:mod:`.paper_mapping`."""

from .attribution import (  # noqa: F401
    DYNAMICS_TERMS,
    attempt_lengths,
    attribution_table,
    baseline_table,
    compare_fits,
    dynamics_table,
    grad_by_level,
    kl_by_level,
    kl_profile,
    load_attribution,
    load_dynamics,
    plot_attribution,
    plot_slopes,
    premise_table,
    question_repeats,
    reproduction,
    reproduction_count,
)
from .claims import (  # noqa: F401
    claims,
    claims_by_seed,
    claims_table,
    headline,
    per_level_table,
    recovery_table,
    rl_sampling_mismatch,
    stratified_table,
)
from .frame import (  # noqa: F401
    TABLE1_KINDS,
    calibration_by_kind,
    check_results,
    first_wrong,
    fmt_interval,
    kinds_in,
    levels_sorted,
    long_table,
    recorded_label,
    results_first,
    reward_trend,
    row_label,
    seeds_of,
    validation_rise,
)
from .levers import futile_rounds, lever_cuts, study_cuts, study_rounds, work_bound  # noqa: F401
from .regime import (  # noqa: F401
    READ_AGAIN,
    REGIME_POINTS,
    graded_design_tables,
    pipeline_workers_table,
    reading_agreement,
    regime_rows,
    regime_table,
    restudy_table,
    round4_table,
    round5_table,
    route_timing,
    run_time,
    workers_projection,
    workers_table,
)
from .retraining import commit_checks, mean_abs_difference, retrained_table  # noqa: F401
from .stages import (  # noqa: F401
    calibration_frame,
    config_table,
    design_table,
    echo_table,
    faithfulness_table,
    first_check_table,
    kang_table,
    mean_by_stage,
    paper_table1,
    plot_calibration,
    plot_first_checks,
    probe_table,
    reflection_table,
    stage_table,
    table1,
    truncation_table,
)
from .training import (  # noqa: F401
    DELTA_KEYS,
    check_schedule,
    delta_table,
    kl_arms,
    kl_table,
    plot_reward_curves,
    plot_schedule,
    plot_validation_curves,
    plot_validation_rows,
    reward_trend_table,
    schedule_summary,
    seed_deltas,
    seed_estimates,
    timings_table,
    validation_rise_table,
)
