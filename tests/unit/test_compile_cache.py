"""Where a run keeps torch.compile's code (``omnibert.run.pipeline.compile_cache``): the
user's ``TORCHINDUCTOR_CACHE_DIR``, else ``$OMNIBERT_CACHE_DIR/compile``, else the run
directory's ``compile_cache``; set early enough that Inductor writes there; said in both
jobs' plans, warm or cold. And the first steps' collectives wait for a peer's compile
(``omnibert.accelerators.compile_allowance``), then ``accelerator.timeout_s`` again."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from finetune_data import mrpc_file

from omnibert.accelerators.compile_allowance import COMPILE_ALLOWANCE_S
from omnibert.accelerators.cpu import CPUPlugin
from omnibert.accelerators.ddp import lost_rank
from omnibert.accelerators.gpu import GPUPlugin
from omnibert.apps.compose import compose
from omnibert.config import FinetuneConfig, TrainConfig
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.run.pipeline.compile_cache import (
    CHOSEN_ENV,
    CHOSEN_TRITON_ENV,
    INDUCTOR_ENV,
    TRITON_ENV,
    torch_default_cache_dir,
    use_compile_cache,
)

#: what chooses the folder, and what omnibert sets
VARIABLES = (INDUCTOR_ENV, TRITON_ENV, CHOSEN_ENV, CHOSEN_TRITON_ENV, "OMNIBERT_CACHE_DIR",
             "OMNIBERT_CACHE")  # fmt: skip
COLD = "cold: empty, the first steps compile"
WARM = "warm: it holds an earlier compile's code"


def _no_cache_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of :data:`VARIABLES` set; each put back as it was after the test (set first, so
    that monkeypatch records the ones absent too, and removes what the run sets)."""
    for name in VARIABLES:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_the_run_directory_holds_the_cache_when_nothing_else_is_set(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    cache = use_compile_cache(tmp_path / "run", env)
    where = tmp_path / "run" / "compile_cache"
    assert cache.path == where and cache.describe() == f"{where} (the run directory; {COLD})"
    assert env == {INDUCTOR_ENV: str(where), CHOSEN_ENV: str(where),
                   TRITON_ENV: str(where / "triton"),
                   CHOSEN_TRITON_ENV: str(where / "triton")}  # fmt: skip
    (where / "fxgraph" / "ab").mkdir(parents=True)
    assert not use_compile_cache(tmp_path / "run", env).warm  # folders alone: nothing compiled
    (where / "fxgraph" / "ab" / "entry").write_bytes(b"code")
    again = use_compile_cache(tmp_path / "run", env)  # a restart, or a rank that inherited env
    assert again.describe() == f"{where} (the run directory; {WARM})"
    other = use_compile_cache(tmp_path / "other", env)  # the next run in this process: its own
    assert other.path == tmp_path / "other" / "compile_cache" and env[INDUCTOR_ENV] == str(
        other.path
    )
    assert env[TRITON_ENV] == str(other.path / "triton")


@pytest.mark.parametrize("name", ["OMNIBERT_CACHE_DIR", "OMNIBERT_CACHE"])
def test_omnibert_cache_dir_holds_every_runs_cache(tmp_path: Path, name: str) -> None:
    env = {name: str(tmp_path / "cache")}
    cache = use_compile_cache(tmp_path / "run", env)
    assert cache.path == tmp_path / "cache" / "compile"
    assert cache.describe() == f"{tmp_path / 'cache' / 'compile'} ($OMNIBERT_CACHE_DIR; {COLD})"
    assert env[INDUCTOR_ENV] == str(tmp_path / "cache" / "compile")


def test_the_users_torchinductor_cache_dir_is_applied_and_said(tmp_path: Path) -> None:
    theirs = tmp_path / "mine"
    env = {INDUCTOR_ENV: str(theirs), "OMNIBERT_CACHE_DIR": str(tmp_path / "cache")}
    cache = use_compile_cache(tmp_path / "run", env)
    assert cache.path == theirs and env[INDUCTOR_ENV] == str(theirs)
    assert cache.source == "TORCHINDUCTOR_CACHE_DIR, set before the run"
    assert TRITON_ENV not in env and CHOSEN_ENV not in env  # theirs, left as it is
    # torch's own folder there was written by importing torch._dynamo: not the user's choice
    env = {INDUCTOR_ENV: torch_default_cache_dir()}
    assert use_compile_cache(tmp_path / "run", env).path == tmp_path / "run" / "compile_cache"
    # the user's Triton folder stays, and the plan says so
    env = {TRITON_ENV: str(tmp_path / "triton")}
    cache = use_compile_cache(tmp_path / "run", env)
    assert env[TRITON_ENV] == str(tmp_path / "triton")
    assert f"Triton's: TRITON_CACHE_DIR={tmp_path / 'triton'}, set before the run" in cache.source


def test_inductor_compiles_into_the_chosen_folder_though_torch_was_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch and torch._dynamo are imported (torch wrote its default folder into the
    environment then); the folder set afterwards is the one Inductor's caches use."""
    import torch._dynamo  # noqa: F401
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._inductor.codecache import FxGraphCache
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    _no_cache_variables(monkeypatch)
    monkeypatch.setenv(INDUCTOR_ENV, torch_default_cache_dir())  # as importing torch left it
    cache = use_compile_cache(tmp_path / "run")
    assert cache.path == tmp_path / "run" / "compile_cache"
    assert cache_dir() == str(cache.path)
    assert Path(FxGraphCache._get_tmp_dir()).parent == cache.path
    assert Path(AOTAutogradCache._get_tmp_dir()).parent == cache.path


def test_both_plans_name_the_compile_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_hf: Path
) -> None:
    from omnibert.run.finetuning import job as finetuning
    from omnibert.run.pretraining.job import prepare

    _no_cache_variables(monkeypatch)
    cfg = compose("pretrain", ["experiment=smoke", f"paths.output_root={tmp_path}"])
    plan = prepare(TrainConfig.of(cfg)).plan
    where = tmp_path / "smoke" / "compile_cache"
    assert dict(plan.rows())["compile cache"] == f"{where} (the run directory; {COLD})"
    assert plan.to_dict()["compile_cache"] == f"{where} (the run directory; {COLD})"
    train = mrpc_file(tmp_path / "train.tsv", 8, 1)
    cfg = compose("finetune", ["task=mrpc", f"data.train_file={train}",
                               f"model.init_from={tiny_hf}", f"paths.output_root={tmp_path}",
                               "run_name=mrpc", "task.max_seq_length=32", "logger=none"])  # fmt: skip
    tuned = finetuning.prepare(FinetuneConfig.of(cfg, FineTuneInputError)).plan
    assert (
        tuned.compile_cache == f"{tmp_path / 'mrpc' / 'compile_cache'} (the run directory; {COLD})"
    )


def _strategy(plugin: object, step: int, entry: str = "fit") -> tuple[object, SimpleNamespace]:
    """``plugin``'s strategy, attached to a stand-in trainer (its step and entry point)."""
    strategy = plugin.trainer_kwargs("32-true")["strategy"]  # type: ignore[attr-defined]
    trainer = SimpleNamespace(global_step=step, state=SimpleNamespace(fn=entry))
    strategy._lightning_module = SimpleNamespace(trainer=trainer)
    return strategy, trainer


@pytest.mark.parametrize("start", [0, 1000], ids=["fresh", "resumed"])
@pytest.mark.parametrize("plugin", [CPUPlugin(devices=2, timeout_s=42),
                                    GPUPlugin(devices=2, timeout_s=42, strategy="fsdp")],
                         ids=["ddp", "fsdp"])  # fmt: skip
def test_the_first_steps_collectives_wait_for_a_cold_compile(
    plugin: object, start: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the group's start through this process's first two steps (from where it
    started or resumed), and in the first validation of fit and of trainer.validate (each
    compiles its graph): the compile allowance; else accelerator.timeout_s (42 s)."""
    applied: list[timedelta] = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed.distributed_c10d, "_set_pg_timeout",
                        lambda timeout, group=None: applied.append(timeout))  # fmt: skip
    strategy, trainer = _strategy(plugin, start)
    allowance, timeout = timedelta(seconds=COMPILE_ALLOWANCE_S), timedelta(seconds=42)
    strategy.apply_collective_timeout()  # what setting up the group does once it exists
    assert applied == [allowance]
    seen = []
    for step, validate in ((0, False), (1, False), (2, True), (3, True), (4, False)):
        trainer.global_step = start + step
        strategy.on_train_batch_start(None, step)
        seen.append(strategy.collective_timeout_now())
        if validate:
            strategy.on_validation_start()
            seen.append(strategy.collective_timeout_now())
            strategy.on_validation_end()
    # steps 1 and 2 compile, then timeout_s; the first validation compiles too, the second not
    assert seen == [allowance, allowance, timeout, allowance, timeout, timeout, timeout]
    assert applied[-1] == timeout
    trainer.state.fn = "validate"  # the final trainer.validate: a graph of its own
    strategy.on_validation_start()
    assert applied[-1] == allowance
    strategy.on_validation_end()
    assert applied[-1] == timeout


def test_a_validation_alone_waits_for_its_compile_then_timeout_s(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    strategy, _ = _strategy(CPUPlugin(devices=2, timeout_s=42), 0, entry="validate")
    assert strategy.collective_timeout_now() == timedelta(seconds=COMPILE_ALLOWANCE_S)
    strategy.on_validation_start()
    assert strategy.collective_timeout_now() == timedelta(seconds=COMPILE_ALLOWANCE_S)
    strategy.on_validation_end()
    assert strategy.collective_timeout_now() == timedelta(seconds=42)


def test_a_timeout_in_the_first_steps_names_the_allowance() -> None:
    error = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms")
    assert str(lost_rank(error, 1, 2, 42)) == (
        "rank 0 stopped responding (no collective for 1800 s, the first steps' allowance for "
        "compiling); the run stops; resume with ckpt_path=last"
    )
