"""Estimators on responses: p_s, p_dC, p_dW and predicted accuracy (:mod:`~dsh.measure.calibration`), the paper's
claims as tests (:mod:`~dsh.measure.predictions`), whether a trace's checks are followed
(:mod:`~dsh.measure.faithfulness`). No model: imports only core, theory and task."""
