"""What the check and the lossy steps' costs share: the runner protocol (``runner``), the torch
runners (the eager float32 baseline and float64 reference, a TorchScript file) and the
comparator (tolerances, deviations, verdicts). Below both: the check calls the costs, and the
costs run and compare with these, never with the check's own modules."""
