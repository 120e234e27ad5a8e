"""Readers and writers for the data formats users already have (MLPerf TFRecord, NVIDIA HDF5)."""
