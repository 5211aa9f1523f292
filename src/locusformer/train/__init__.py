"""Training: the loop, its schedule, checkpoints, devices, alignment targets and data access."""
