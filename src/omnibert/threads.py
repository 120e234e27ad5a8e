"""How many intra-op threads a CPU training process runs, and how its OpenMP threads wait.

PyTorch starts one OpenMP thread per core it counts, and by default those threads spin
while they wait for each other. When another process takes a core (a second job, a
compiler, another user on a shared box), every parallel region ends waiting for the thread
whose core was taken, while the others spin: the demo loses most of its speed to one
competing process on two cores (docs/accelerators/cpu.md, ``scripts/bench_shared_cpu.py``).
So:

* the thread count comes from the CPUs this process may really use: its affinity mask
  (``os.sched_getaffinity``, what ``taskset``/SLURM/docker ``--cpuset-cpus`` restrict), the
  cgroup CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``:
  docker ``--cpus``, Kubernetes limits), shared by the training processes of this node.
  Loader worker processes are subtracted only for the cores they really use: a worker
  collating pre-tokenised rows (Arrow shards, packed or not, and generated rows) spends
  :data:`LOADER_SECONDS_PER_ROW` of one core per row, a small share of a core at the rates
  a CPU trains at, so on a CPU the workers are not subtracted unless the model runs so many
  rows per second that they need half a core or more (:func:`worker_cores`; subtracting them
  anyway costs a 2-core run one of its two threads for nothing);
* the wait policy: ``OMP_WAIT_POLICY=PASSIVE`` (and ``KMP_BLOCKTIME=0`` for Intel's
  OpenMP) makes waiting threads sleep instead of spin. OpenMP runtimes read these when they
  load, i.e. when torch is imported: ``omnibert-train`` sets them right after its config is
  composed and before anything imports torch (:func:`set_wait_policy_env`), and loader
  workers inherit them.

``accelerator.threads`` (an int) and ``OMP_NUM_THREADS`` override the count,
``accelerator.omp_wait_policy`` (``passive``, ``active`` or null = the runtime's default)
and an ``OMP_WAIT_POLICY`` already in the environment the policy. This module imports no
torch at module level.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "LOADER_SECONDS_PER_ROW",
    "cgroup_cpu_limit",
    "choose_threads",
    "set_wait_policy_env",
    "usable_cpus",
    "worker_cores",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: one core's seconds a loader worker spends per training row: the most of Arrow rows,
#: online-packed Arrow rows and generated rows, bert-tiny's seq-128 shapes, one thread (an
#: estimate for sizing the loader, not a recorded measurement: docs/accelerators/cpu.md)
LOADER_SECONDS_PER_ROW = 80e-6
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
WAIT_POLICIES = ("passive", "active")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_dirs(root: Path, proc_cgroup: Path) -> list[tuple[Path, str]]:
    """``(directory, version)`` of this process's cgroup, its ancestors and the mount root,
    most specific first (inside a container the process's cgroup is usually the root)."""
    dirs: list[tuple[Path, str]] = []
    for line in (_read(proc_cgroup) or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            bases, version = [root], "v2"
        elif "cpu" in controllers.split(","):
            bases = [root / name for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu")]
            version = "v1"
        else:
            continue
        parts = [p for p in rel.strip("/").split("/") if p]
        for base in bases:
            for depth in range(len(parts), -1, -1):
                dirs.append((base.joinpath(*parts[:depth]), version))
    dirs += [(root, "v2")] + [(root / n, "v1") for n in ("cpu", "cpu,cpuacct")]
    return dirs


def cgroup_cpu_limit(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP
) -> tuple[float | None, str]:
    """The CPU quota of this process's cgroup in CPUs (``None``: no quota) and where it
    was read. The tightest quota on the way to the root applies."""
    best: tuple[float | None, str] = (None, "no cgroup CPU quota")
    seen: set[Path] = set()
    for folder, version in _cgroup_dirs(root, proc_cgroup):
        if folder in seen:
            continue
        seen.add(folder)
        if version == "v2":
            text = _read(folder / "cpu.max")
            if text is None:
                continue
            quota, _, period = text.partition(" ")
            if quota == "max" or not period:
                continue
            cpus, where = int(quota) / int(period), f"{folder / 'cpu.max'}: {text}"
        else:
            quota_text = _read(folder / "cpu.cfs_quota_us")
            period_text = _read(folder / "cpu.cfs_period_us")
            if quota_text is None or period_text is None or int(quota_text) <= 0:
                continue
            cpus = int(quota_text) / int(period_text)
            where = f"{folder / 'cpu.cfs_quota_us'}: {quota_text}/{period_text}"
        if best[0] is None or cpus < best[0]:
            best = (cpus, where)
    return best


def usable_cpus(
    affinity: Callable[[], set[int]] | None = None,
    cgroup: Callable[[], tuple[float | None, str]] = cgroup_cpu_limit,
) -> tuple[int, str]:
    """How many CPUs this process may use (affinity mask, capped by the cgroup quota,
    rounded down, at least 1) and how that was found."""
    if affinity is not None:
        mask: set[int] | None = affinity()
    elif hasattr(os, "sched_getaffinity"):
        mask = os.sched_getaffinity(0)
    else:  # macOS, Windows: no affinity API
        mask = None
    if mask is not None:
        cpus = len(mask)
        how = f"affinity {cpus} CPU{'s' if cpus != 1 else ''}"
    else:
        cpus = os.cpu_count() or 1
        how = f"{cpus} CPUs"
    quota, where = cgroup()
    if quota is not None and math.floor(quota) < cpus:
        cpus = max(1, math.floor(quota))
        how += f", cgroup quota {quota:g} CPUs ({where})"
    return cpus, how


def worker_cores(num_workers: int, rows_per_second: float | None) -> float:
    """The cores ``num_workers`` loader workers keep busy feeding ``rows_per_second`` training
    rows (:data:`LOADER_SECONDS_PER_ROW` each), at most one each; without a rate, the rate of
    the smallest preset on a CPU (bert-tiny, 2 cores: docs/accelerators/cpu.md)."""
    if num_workers <= 0:
        return 0.0
    rate = 150.0 if rows_per_second is None else max(0.0, rows_per_second)
    return min(float(num_workers), rate * LOADER_SECONDS_PER_ROW)


def choose_threads(
    requested: int | None,
    num_workers: int,
    processes_per_node: int = 1,
    environ: dict[str, str] | None = None,
    cpus: tuple[int, str] | None = None,
    rows_per_second: float | None = None,
) -> tuple[int, str]:
    """Intra-op threads for one training process and the reason: ``requested``
    (``accelerator.threads``), else ``OMP_NUM_THREADS`` from the environment, else the
    usable CPUs shared by ``processes_per_node`` processes, less the whole cores its
    ``num_workers`` loader workers use at ``rows_per_second`` (:func:`worker_cores`), at
    least 1."""
    env = os.environ if environ is None else environ
    if requested is not None:
        return int(requested), f"accelerator.threads={requested}"
    from_env = env.get("OMP_NUM_THREADS", "").strip()
    if from_env.isdigit() and int(from_env) > 0:
        return int(from_env), f"OMP_NUM_THREADS={from_env} in the environment"
    total, how = cpus if cpus is not None else usable_cpus()
    share = max(1, total // max(1, processes_per_node))
    busy = worker_cores(num_workers, rows_per_second)
    reserved = min(num_workers, math.floor(busy + 0.5))
    threads = max(1, share - reserved)
    parts = [how]
    if processes_per_node > 1:
        parts.append(f"/ {processes_per_node} processes")
    if num_workers:
        plural = "s" if num_workers != 1 else ""
        at = "" if rows_per_second is None else f" at {rows_per_second:,.0f} rows/s"
        load = f"{busy:.2f} of a core{at}"
        if reserved:
            parts.append(f"- {reserved} core{'s' if reserved != 1 else ''} for {num_workers} "
                         f"loader worker{plural} ({load})")  # fmt: skip
        else:
            parts.append(f"({num_workers} loader worker{plural} not subtracted: they need "
                         f"{load})")  # fmt: skip
    return threads, f"auto: {' '.join(parts)}"


#: set by :func:`set_wait_policy_env` to what it put in the environment (a later call in
#: the same process, after torch was imported, reports that instead of "too late")
MARKER = "OMNIBERT_OMP_WAIT_POLICY"


def set_wait_policy_env(policy: str | None, environ: dict[str, str] | None = None) -> str:
    """Put the OpenMP wait policy into the environment (``OMP_WAIT_POLICY``, and
    ``KMP_BLOCKTIME=0`` with ``passive`` for Intel OpenMP) unless the user set it there;
    returns what applies, in words. Effective only before the OpenMP runtime loads (before
    ``import torch``): after that the words say so."""
    env = os.environ if environ is None else environ
    if policy is not None and policy not in WAIT_POLICIES:
        from omnibert.errors import UserError

        raise UserError(
            f"accelerator.omp_wait_policy={policy!r} is not a wait policy; use passive, active "
            "or null (the OpenMP runtime's default)."
        )
    if env.get(MARKER) and env.get(MARKER, "").startswith(
        f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY')} "
    ):
        return env[MARKER]
    if env.get("OMP_WAIT_POLICY"):
        return f"OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']} from the environment"
    if policy is None:
        return "the OpenMP runtime's default wait policy (accelerator.omp_wait_policy=null)"
    env["OMP_WAIT_POLICY"] = policy.upper()
    if policy == "passive":
        env.setdefault("KMP_BLOCKTIME", "0")
    how = f"OMP_WAIT_POLICY={policy.upper()} (accelerator.omp_wait_policy)"
    if "torch" in sys.modules:
        return f"{how}, set after torch was imported: no effect in this process"
    env[MARKER] = how
    return how
