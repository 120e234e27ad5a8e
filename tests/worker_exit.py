"""How the torchrun test workers (``lamb_*_worker.py``) leave: together, without gloo's teardown.

Under a loaded full suite a gloo rank has aborted in its C++ teardown (SIGABRT, "terminate
called without an active exception") after its work was done and written, once with
``destroy_process_group`` after a barrier and once without. The barrier keeps every rank's
results ahead of the exit; ``os._exit`` then skips the teardown that aborts (the process
group's threads and the interpreter's finalisers), so a finished worker exits 0.
"""

from __future__ import annotations

import os
import sys

import torch.distributed as dist


def leave_together() -> None:
    """Wait for every rank, flush this one's output and exit 0 without tearing gloo down."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
