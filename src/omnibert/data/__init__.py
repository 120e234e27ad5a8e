"""Pretraining data: tokenisation, instance creation, shard formats, readers."""
