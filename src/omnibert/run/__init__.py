"""What the apps derive and check before compute: the batch plan and the run's checks
(:mod:`~omnibert.run.pretraining.plan`, :mod:`~omnibert.run.pretraining.checks`), compile-only reports
(:mod:`~omnibert.run.sizing.compile_only`), profiling (:mod:`~omnibert.run.launching.profiling`) and the SLURM
layout check (:mod:`~omnibert.run.launching.slurm`)."""
