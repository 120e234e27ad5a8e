"""omnibert-finetune: inputs, the job (prepare/build/fit/run), outputs at any batch, GLUE report."""
