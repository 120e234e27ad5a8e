"""Launching runs: sweeps (Hydra multirun) and their reports, the SLURM layout, profiling."""
