"""omnibert.compat: every fallback for the older torch / Lightning of the vendor environments
(Graphcore: torch 2.0.1, Lightning 2.3) runs here with the newer API taken away, and gives
what the newer API gives. scripts/envs/ipu_env.sh runs the suite's IPU-path tests under the
old versions themselves."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from omnibert import compat
from omnibert.callbacks.throughput import bert_pretraining_flops, measure_flops
from omnibert.checkpoints.resuming import CompletedBatchProgress
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.run.sizing.activation_memory import meta_batch


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.inner(x)) * 2


def _counting_backend(calls: list[int]) -> Any:
    def backend(graph: torch.fx.GraphModule, inputs: Any) -> Any:
        calls.append(1)
        return graph.forward

    return backend


# ---------------------------------------------------------------------- compile
def test_compile_in_place_without_module_compile_keeps_the_state_dict_keys(monkeypatch):
    """torch < 2.2 has no nn.Module.compile; torch.compile(model) would prefix every key
    with _orig_mod. The fallback compiles the class's forward and binds it to the model."""
    monkeypatch.delattr(nn.Module, "compile", raising=False)
    monkeypatch.setattr(compat, "HAS_MODULE_COMPILE", False)
    torch._dynamo.reset()
    model, calls = Small(), []
    keys = list(model.state_dict())
    x = torch.randn(2, 4)
    eager = model(x)
    assert compat.compile_in_place(model, {"backend": _counting_backend(calls)}) is model
    assert torch.equal(model(x), eager) and calls == [1]  # the compiled forward ran
    assert list(model.state_dict()) == keys == ["inner.weight", "inner.bias"]
    twin = copy.deepcopy(model)  # a copy's forward is bound to the copy, not to the original
    with torch.no_grad():
        twin.inner.bias.add_(1.0)
    assert not torch.equal(twin(x), model(x))


def test_compile_in_place_uses_module_compile_where_torch_has_it():
    if not hasattr(nn.Module, "compile"):
        pytest.skip(f"torch {torch.__version__} has no nn.Module.compile")
    torch._dynamo.reset()
    model, calls = Small(), []
    compat.compile_in_place(model, {"backend": _counting_backend(calls)})
    model(torch.randn(2, 4))
    assert calls == [1] and "forward" not in vars(model)  # compiled by nn.Module.compile


# ---------------------------------------------------------------------- checkpoints
def test_load_checkpoint_without_mmap_reads_the_whole_file(tmp_path: Path, monkeypatch):
    path = tmp_path / "x.ckpt"
    torch.save({"hyper_parameters": {"model_config": {"hidden_size": 8}}, "w": torch.ones(3)}, path)
    seen: list[dict[str, Any]] = []
    real_load = torch.load

    def old_load(f: Any, map_location: Any = None, weights_only: bool = False, **pickle: Any):
        """torch 2.0's signature: other keywords go to pickle, which refuses mmap."""
        seen.append(dict(pickle))
        if pickle:
            raise TypeError(f"Unpickler() got an unexpected keyword argument {next(iter(pickle))}")
        return real_load(f, map_location=map_location, weights_only=weights_only)

    monkeypatch.setattr(torch, "load", old_load)
    monkeypatch.setattr(compat, "HAS_LOAD_MMAP", False)
    loaded = compat.load_checkpoint(path, mmap=True)
    assert loaded["hyper_parameters"]["model_config"] == {"hidden_size": 8} and seen == [{}]


def test_load_checkpoint_maps_where_torch_can(tmp_path: Path):
    if not compat.HAS_LOAD_MMAP:
        pytest.skip(f"torch {torch.__version__} has no torch.load(mmap=...)")
    path = tmp_path / "x.ckpt"
    torch.save({"w": torch.arange(4.0)}, path)
    assert torch.equal(compat.load_checkpoint(path, mmap=True)["w"], torch.arange(4.0))


# ---------------------------------------------------------------------- Lightning
def test_seed_everything_is_quiet_on_a_lightning_without_verbose(monkeypatch, caplog):
    from lightning.fabric.utilities import seed as seed_module

    real = seed_module.seed_everything

    def old_seed_everything(seed: int | None = None, workers: bool = False) -> int:
        """Lightning 2.3's signature: always logs "Seed set to"."""
        if "verbose" in real.__code__.co_varnames:
            return int(real(seed, workers, verbose=True))
        return int(real(seed, workers))

    monkeypatch.setattr(pl, "seed_everything", old_seed_everything)
    with caplog.at_level(logging.INFO):
        old_seed_everything(3)
    assert "Seed set to 3" in caplog.text  # what the shim has to silence
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert compat.seed_everything(11) == 11
    assert "Seed set to" not in caplog.text and torch.initial_seed() == 11
    assert logging.getLogger("lightning.fabric.utilities.seed").level == logging.NOTSET


def _loops(processed: int, completed: int, last: bool = False) -> dict[str, Any]:
    """A Lightning checkpoint's fit-loop counters (the keys Lightning 2.3 writes)."""

    def counts(done: int, started: int | None = None) -> dict[str, int]:
        started = done if started is None else started
        return {"ready": started, "started": started, "processed": done, "completed": done}

    batch = {"ready": processed, "started": processed, "processed": processed,
             "completed": completed}  # fmt: skip
    return {"loops": {"fit_loop": {
        "epoch_progress": {"total": counts(2, 3), "current": counts(2, 3)},
        "epoch_loop.batch_progress": {"total": dict(batch), "current": dict(batch),
                                      "is_last_batch": last},
        "epoch_loop.scheduler_progress": {"total": counts(9), "current": counts(4)},
        "epoch_loop.automatic_optimization.optim_progress": {
            "optimizer": {"step": {"total": counts(9), "current": counts(4)}}},
        "epoch_loop.val_loop.batch_progress": {"total": counts(5), "current": counts(5)},
        "epoch_loop.state_dict": {"_batches_that_stepped": 4},
    }}}  # fmt: skip


class _Trainer:
    """What CompletedBatchProgress reads of a Lightning 2.3 Trainer inside on_train_batch_end."""

    def __init__(self, steps: bool = True, validates: bool = False) -> None:
        self.num_training_batches = 9
        loop = type(
            "EpochLoop",
            (),
            {
                "_should_accumulate": lambda _: not steps,
                "_should_check_val_fx": lambda _, fetcher: validates,
            },
        )()
        self.fit_loop = type("FitLoop", (), {"epoch_loop": loop, "_data_fetcher": None})()


@pytest.fixture
def lightning_2_3(monkeypatch):
    monkeypatch.setattr(
        "omnibert.checkpoints.resuming.lightning_resumes_after_batch_end", lambda: False
    )


def _save(trainer: Any, checkpoint: dict[str, Any]) -> None:
    pl_module: Any = None  # not read
    CompletedBatchProgress().on_save_checkpoint(trainer, pl_module, checkpoint)


def _fit(ckpt: dict[str, Any]) -> dict[str, Any]:
    return ckpt["loops"]["fit_loop"]


def test_completed_batch_progress_marks_a_batch_end_checkpoint_completed(lightning_2_3):
    """Lightning < 2.5 reruns a batch saved in on_train_batch_end; 2.5 corrects it itself."""
    inside = _loops(processed=7, completed=6)  # written in on_train_batch_end, mid-epoch
    _save(_Trainer(), inside)
    fit = _fit(inside)
    assert fit["epoch_loop.batch_progress"]["total"]["completed"] == 7
    assert fit["epoch_loop.batch_progress"]["current"]["completed"] == 7
    assert fit["epoch_loop.state_dict"]["_batches_that_stepped"] == 5  # it stepped
    assert fit["epoch_progress"] == _fit(_loops(7, 6))["epoch_progress"]  # epoch goes on
    accumulating = _loops(processed=7, completed=6)
    _save(_Trainer(steps=False), accumulating)
    assert _fit(accumulating)["epoch_loop.state_dict"]["_batches_that_stepped"] == 4
    after = _loops(processed=7, completed=7)  # written after the batch (validation end)
    _save(_Trainer(), after)
    assert after == _loops(processed=7, completed=7)


def test_completed_batch_progress_finishes_the_epoch_its_last_batch_ended(lightning_2_3):
    ended = _loops(processed=9, completed=8, last=True)
    _save(_Trainer(), ended)
    fit = _fit(ended)
    assert fit["epoch_progress"]["current"] == {"ready": 3, "started": 3, "processed": 3,
                                                "completed": 3}  # fmt: skip
    assert fit["epoch_loop.batch_progress"]["current"] == dict.fromkeys(
        ("ready", "started", "processed", "completed"), 0
    )
    assert fit["epoch_loop.batch_progress"]["total"]["completed"] == 9
    assert fit["epoch_loop.batch_progress"]["is_last_batch"] is False
    assert fit["epoch_loop.scheduler_progress"]["current"]["completed"] == 0
    assert fit["epoch_loop.scheduler_progress"]["total"]["completed"] == 9
    step = fit["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]
    assert step["current"]["completed"] == 0 and step["total"]["completed"] == 9
    assert fit["epoch_loop.val_loop.batch_progress"]["total"]["completed"] == 0
    # a validation due after that batch runs first on resume: the epoch is left open for it
    validating = _loops(processed=9, completed=8, last=True)
    _save(_Trainer(validates=True), validating)
    assert _fit(validating)["epoch_progress"] == _fit(_loops(9, 8))["epoch_progress"]
    assert _fit(validating)["epoch_loop.batch_progress"]["current"]["completed"] == 9


def test_completed_batch_progress_leaves_lightning_2_5_checkpoints_alone():
    if not compat.lightning_resumes_after_batch_end():
        pytest.skip(f"Lightning {pl.__version__} needs the correction")
    ckpt = {"loops": {"fit_loop": {"epoch_loop.batch_progress": {
        "total": {"processed": 3, "completed": 2}, "current": {"processed": 3, "completed": 2},
    }}}}  # fmt: skip
    _save(None, ckpt)
    assert ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["completed"] == 2


# ---------------------------------------------------------------------- foreach ops
def _tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g).to(torch.bfloat16) for shape in ((5, 3), (7,), (2, 2))]


def test_foreach_norm_fp32_without_the_dtype_keyword(monkeypatch):
    new = compat.foreach_norm_fp32(_tensors())
    real = torch._foreach_norm

    def old_foreach_norm(tensors: Any, ord: Any = 2) -> Any:  # torch 2.0: no dtype
        return real(tensors, ord)

    monkeypatch.setattr(torch, "_foreach_norm", old_foreach_norm)
    assert compat._foreach_norm_takes_dtype() is False
    monkeypatch.setattr(compat, "HAS_FOREACH_NORM_DTYPE", False)
    old = compat.foreach_norm_fp32(_tensors())
    assert all(t.dtype == torch.float32 for t in old)  # accumulated in fp32, not bf16
    assert all(torch.equal(a, b) for a, b in zip(old, new, strict=True))


def test_foreach_copy_without_the_foreach_op(monkeypatch):
    src = _tensors()
    monkeypatch.delattr(torch, "_foreach_copy_", raising=False)
    dst = [torch.zeros_like(t) for t in src]
    compat.foreach_copy_(dst, src)
    assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))


def test_foreach_mul_by_a_zero_dim_tensor():
    scale = torch.tensor(0.25)
    assert all(
        torch.equal(a, t * scale)
        for a, t in zip(compat.foreach_mul(_tensors(), scale), _tensors(), strict=True)
    )


# ---------------------------------------------------------------------- FLOP counting
CONFIG = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=64)  # fmt: skip
SHAPES = {"input_ids": [4, 32], "masked_lm_positions": [4, 5], "nsp_labels": [4, 1]}


def test_without_torch_flop_counter_the_matmul_counter_counts_the_same(monkeypatch):
    batch = meta_batch(SHAPES)
    counted = measure_flops(lambda: BertForPreTraining(CONFIG), batch)
    monkeypatch.setattr(compat, "_flop_counter", None)  # torch < 2.1
    assert compat.flop_counter_name().startswith("omnibert.compat matmul counter")
    fallback = measure_flops(lambda: BertForPreTraining(CONFIG), batch)
    assert fallback == counted == bert_pretraining_flops(CONFIG, 4, 32, 5)


def test_the_matmul_counter_sees_the_written_out_attention_on_the_cpu():
    """With dropout on the CPU the model computes attention with matmuls (not SDPA)."""
    model = BertForPreTraining(CONFIG)
    batch = _cpu_batch()
    with compat.flop_counter() as reference:
        model(batch)["loss"].backward()
    with compat._MatmulFlopCounter() as ours:
        model(batch)["loss"].backward()
    assert ours.get_total_flops() == reference.get_total_flops() > 0


def _cpu_batch() -> dict[str, torch.Tensor]:
    from omnibert.data.datamodule import PretrainingDataModule
    from omnibert.data.generated import GeneratedSource

    dm = PretrainingDataModule(source=GeneratedSource, vocab_size=100, max_seq_length=32,
                               max_predictions_per_seq=5, micro_batch_size=4,
                               num_train_samples=8, num_eval_samples=0, num_workers=0)  # fmt: skip
    dm.setup("fit")
    batch: dict[str, torch.Tensor] = next(iter(dm.train_dataloader()))
    return batch


@pytest.mark.parametrize("bias", [True, False], ids=["bert", "no_bias"])
def test_norms_build_without_layernorms_bias_keyword(monkeypatch, bias):
    """torch 2.0.1 (the IPU's) has no ``nn.LayerNorm(bias=...)``: every model builds without
    that keyword, and a norm without bias is what ``bias=False`` builds in newer torch (the
    same parameters and state-dict keys, the same output)."""
    original = nn.LayerNorm.__init__

    def torch_2_0_signature(self, normalized_shape, eps=1e-5, elementwise_affine=True,
                            device=None, dtype=None):  # fmt: skip
        original(self, normalized_shape, eps, elementwise_affine, device=device, dtype=dtype)

    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=24, max_position_embeddings=32, bias=bias,
                        position_encoding="rope", feed_forward="geglu", norm_position="pre",
                        type_vocab_size=0, next_sentence_head=False)  # fmt: skip
    torch.manual_seed(0)
    newer = BertForPreTraining(config)
    monkeypatch.setattr(nn.LayerNorm, "__init__", torch_2_0_signature)
    torch.manual_seed(0)
    older = BertForPreTraining(config)
    assert older.state_dict().keys() == newer.state_dict().keys()
    assert any(name.endswith("final_norm.bias") for name in newer.state_dict()) is bias
    for name, tensor in newer.state_dict().items():
        assert torch.equal(older.state_dict()[name], tensor), name
    hidden = torch.randn(3, 16)
    assert torch.equal(older.bert.final_norm(hidden), newer.bert.final_norm(hidden))
