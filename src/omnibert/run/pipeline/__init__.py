"""What both jobs share: the prepared run, builders, the safe fit, kernels, _target_ key checks."""
