"""Offline data preparation, text → shards (``omnibert-prepare``); never imported by training.

* text sources: :mod:`~omnibert.prepare.corpus` (the embedded demo corpus),
  :mod:`~omnibert.prepare.wikipedia` (dump → sentence-per-line shards),
  :mod:`~omnibert.prepare.sentences` (offline sentence splitting);
* :mod:`~omnibert.prepare.vocab_training`: a deterministic WordPiece vocab from text;
* instances exactly as Google's ``create_pretraining_data.py``:
  :mod:`~omnibert.prepare.instances` (settings, reading), :mod:`~omnibert.prepare.instance_kernel`
  (the compiled loop), :mod:`~omnibert.prepare.python_random` (CPython's ``random`` in numba);
* :mod:`~omnibert.prepare.shards` (atomic Arrow part writer) and
  :mod:`~omnibert.prepare.pipeline` (parallel, resumable, metadata);
* :mod:`~omnibert.prepare.pack_index`: the offline pack index ``data.packing=offline`` reads.

This package's ``__init__`` imports nothing: importing one module here never pulls in numba
or the pipeline. The TFRecord / HDF5 readers live in :mod:`omnibert.formats` (training
converts those files too).
"""
