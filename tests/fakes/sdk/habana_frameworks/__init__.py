"""FAKE habana_frameworks for CPU tests (not Intel's package)."""
