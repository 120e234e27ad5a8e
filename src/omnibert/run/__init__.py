"""What the apps derive and check before compute: the batch plan and the run's checks
(:mod:`~omnibert.run.plan`, :mod:`~omnibert.run.checks`), compile-only reports
(:mod:`~omnibert.run.compile_only`), profiling (:mod:`~omnibert.run.profiling`) and the SLURM
layout check (:mod:`~omnibert.run.slurm`)."""
