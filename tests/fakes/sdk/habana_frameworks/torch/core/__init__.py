"""FAKE ``habana_frameworks.torch.core``: ``mark_step`` only records that it was called."""

from __future__ import annotations

import os

#: (name, detail) of every call into the fake SDK, shared by ``core`` and ``hpu``
CALLS: list[tuple[str, object]] = []
#: the lazy-mode setting seen when this fake was first imported (the real SDK reads it then)
LAZY_MODE_AT_IMPORT = os.environ.get("PT_HPU_LAZY_MODE")


def mark_step(device_str: str = "", sync: bool = False) -> None:
    CALLS.append(("mark_step", {"device_str": device_str, "sync": sync}))
