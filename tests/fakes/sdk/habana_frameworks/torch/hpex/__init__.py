"""FAKE habana_frameworks.torch.hpex for CPU tests."""
