"""FAKE habana_frameworks.torch for CPU tests."""
