"""What the apps derive, check and run before and around compute, one package per subject."""
