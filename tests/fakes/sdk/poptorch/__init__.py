"""FAKE poptorch for CPU tests (not Graphcore's package): records optimiser construction."""

from . import optim

__all__ = ["optim"]
__version__ = "0.0.0+fake"
