"""Training-time data: one ``PretrainingDataModule`` over Arrow, converted TFRecord/HDF5 or
generated rows, static-shape collate, resumable per-rank samplers and packed training."""
