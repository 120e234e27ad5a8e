"""FAKE habana_frameworks.torch for CPU tests (not Intel's package).

``hpu`` and ``core`` follow the documented names; every call is appended to ``CALLS``.
"""

from . import core, hpu

CALLS: list[tuple[str, object]] = core.CALLS

__all__ = ["CALLS", "core", "hpu"]
