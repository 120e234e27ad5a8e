"""Checkpoints, one home: reading, writing, saving, resuming, init_from and disk space."""
