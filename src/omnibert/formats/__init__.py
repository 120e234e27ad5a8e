"""Readers and writers for the data formats users already have (MLPerf TFRecord, NVIDIA HDF5).

Importing this package imports no reader: the training side reads :data:`FILE_SUFFIXES`
here and imports a reader only when it converts files.
"""

#: format -> the file name endings of its files
FILE_SUFFIXES = {
    "tfrecord": (".tfrecord", ".tfrecords", ".gz"),
    "hdf5": (".hdf5", ".h5"),
}
