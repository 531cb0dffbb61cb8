"""Where a run executes: device, processes, the run directory and its files, checkpoints and
TensorBoard logs."""
