"""Triton (GPU) kernels for omnibert, each with a torch reference and a parity test."""
