"""How a finished gloo process leaves: together with its group, without gloo's teardown.

Under a loaded machine a gloo rank has aborted in its C++ teardown (SIGABRT, "terminate called
without an active exception") after its work was done and written, once with
``destroy_process_group`` after a barrier and once without. :func:`leave_together`'s barrier
keeps every rank's results ahead of the exit; ``os._exit`` then skips the teardown that aborts
(the process group's threads and the interpreter's finalisers), so a finished process exits 0.
For processes that own their group (benchmark ranks, test workers), not for Lightning's runs,
whose strategy tears its group down itself.
"""

from __future__ import annotations

import os
import sys

__all__ = ["leave_together"]


def leave_together() -> None:
    """Wait for every rank, flush this one's output and exit 0 without tearing gloo down."""
    import torch.distributed as dist

    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
