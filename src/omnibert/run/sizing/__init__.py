"""Sizing before compute: memory per micro batch, the speed probe and its cache, compile-only."""
