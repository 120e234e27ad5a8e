"""omnibert-train: prepare, build and fit a pretraining run; its batches, plan, checks, phases."""
