"""Where a run's compiled code is kept, so that a restarted run does not compile again.

``torch.compile`` (the model's step, LAMB's compiled kernels, FlexAttention) and Triton keep
what they compile on disk, by default in ``/tmp/torchinductor_$USER``: a container or node
that restarts finds it empty, so every rank of a restarted group compiles again, and every
run of a machine shares one folder. Both jobs (:mod:`omnibert.run.pretraining.job`,
:mod:`omnibert.run.finetuning.job`) call :func:`use_compile_cache` before anything can
compile, which chooses, in this order:

1. ``$TORCHINDUCTOR_CACHE_DIR`` where the user set it: theirs is applied, and the plan says so
   (naming torch's own default, ``/tmp/torchinductor_$USER``, counts as unset: importing
   ``torch._dynamo`` writes that value into the environment);
2. ``$OMNIBERT_CACHE_DIR/compile`` where that is set (``$OMNIBERT_CACHE``, its older name,
   too): one folder for the user's runs. Inductor's keys hold the graph, torch's version and
   the device, so runs that share it reuse only what they compiled alike;
3. ``<paths.run_dir>/compile_cache``: the run's own directory, the one a restart
   (``ckpt_path=auto``, ``last``) finds again.

and sets ``TORCHINDUCTOR_CACHE_DIR`` to it (with ``TRITON_CACHE_DIR`` = ``<it>/triton``
unless the user set that: Triton kernels compiled outside Inductor, ``omnibert_kernels``'
LAMB, go there too). Inductor reads the variable at each compile and writes it back made
absolute; setting it after ``import torch`` takes effect as long as nothing has compiled
yet. Every rank derives the same folder from the same config and environment (ranks that
Lightning starts inherit the variables). The plan prints the folder, why it is the one, and
whether it is warm (it holds files from an earlier compile) or cold.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from omnibert.paths import CACHE_DIR_ENV, cache_dir_from_env

__all__ = [
    "CHOSEN_ENV",
    "CHOSEN_TRITON_ENV",
    "COMPILE_CACHE_NAME",
    "INDUCTOR_ENV",
    "TRITON_ENV",
    "CompileCache",
    "choose_compile_cache",
    "torch_default_cache_dir",
    "use_compile_cache",
]

#: Inductor's cache folder variable (``torch._inductor.runtime.cache_dir_utils.cache_dir``)
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: Triton's (Inductor derives ``<its folder>/triton/<device>`` where it is unset)
TRITON_ENV = "TRITON_CACHE_DIR"
#: the folder omnibert chose, set beside :data:`INDUCTOR_ENV`: a value equal to it is
#: omnibert's own (a later run in this process, a rank that inherited the environment), not
#: the user's
CHOSEN_ENV = "OMNIBERT_COMPILE_CACHE"
#: the Triton folder omnibert set (so a later run in this process sets its own)
CHOSEN_TRITON_ENV = "OMNIBERT_COMPILE_CACHE_TRITON"
#: the folder's name in a run directory
COMPILE_CACHE_NAME = "compile_cache"
#: its name under ``$OMNIBERT_CACHE_DIR``
SHARED_NAME = "compile"


@dataclass(frozen=True)
class CompileCache:
    """The run's compile cache: ``path`` (absolute), ``source`` (why this folder, in words)
    and ``warm`` (it held a file when the run started)."""

    path: Path
    source: str
    warm: bool

    def describe(self) -> str:
        """The plan's line: ``<path> (<source>; warm|cold: ...)``."""
        state = (
            "warm: it holds an earlier compile's code"
            if self.warm
            else "cold: empty, the first steps compile"
        )
        return f"{self.path} ({self.source}; {state})"


def choose_compile_cache(
    run_dir: str | Path, environ: MutableMapping[str, str] | None = None
) -> tuple[Path, str, bool]:
    """``(folder, why, user's)``: the folder of the module docstring's rule for a run in
    ``run_dir``, with ``environ`` (``os.environ``) as it is; ``user's``: the user set
    ``TORCHINDUCTOR_CACHE_DIR`` (omnibert leaves it, and Triton's, as they are)."""
    env = os.environ if environ is None else environ
    given = env.get(INDUCTOR_ENV)
    if given and given not in (env.get(CHOSEN_ENV), torch_default_cache_dir()):
        return Path(os.path.abspath(given)), f"{INDUCTOR_ENV}, set before the run", True
    shared = cache_dir_from_env(env)
    if shared:
        return Path(os.path.abspath(Path(shared) / SHARED_NAME)), f"${CACHE_DIR_ENV}", False
    return Path(os.path.abspath(Path(run_dir) / COMPILE_CACHE_NAME)), "the run directory", False


def use_compile_cache(
    run_dir: str | Path, environ: MutableMapping[str, str] | None = None
) -> CompileCache:
    """Choose the run's compile cache (:func:`choose_compile_cache`) and set the variables
    that make Inductor and Triton use it (``environ``: ``os.environ``); call it before
    anything compiles. Creates no folder (the first compile does)."""
    env = os.environ if environ is None else environ
    path, source, users = choose_compile_cache(run_dir, env)
    if not users:
        env[INDUCTOR_ENV] = env[CHOSEN_ENV] = str(path)
        triton = env.get(TRITON_ENV)
        if triton and triton != env.get(CHOSEN_TRITON_ENV):
            source += f"; Triton's: {TRITON_ENV}={triton}, set before the run"
        else:
            env[TRITON_ENV] = env[CHOSEN_TRITON_ENV] = str(path / "triton")
    return CompileCache(path, source, _holds_a_file(path))


def torch_default_cache_dir() -> str:
    """Inductor's own folder, ``/tmp/torchinductor_$USER``: importing ``torch._dynamo``
    (Lightning does) writes it into ``TORCHINDUCTOR_CACHE_DIR``, so that value there is
    torch's, not the user's."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # compat: newer
    except ImportError:  # older torch (the vendor environments') names the folder inline
        import getpass
        import tempfile

        return os.path.abspath(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}")
    return os.path.abspath(default_cache_dir())


def _holds_a_file(path: Path) -> bool:
    """Whether ``path`` holds a file at any depth (stops at the first one found)."""
    try:
        return any(entry.is_file() for entry in path.rglob("*"))
    except OSError:
        return False
