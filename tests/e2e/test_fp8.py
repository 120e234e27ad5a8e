"""``trainer.precision=fp8`` (torchao's float8 training) on the CPU, through torchao's
emulated fp8 maths (``trainer.fp8.emulate=true``): which layers are swapped and which stay
bf16, the refusals before compute, a short run's losses and updates against the same run in
bf16, and checkpoints, resume across precisions and export unchanged.

The real fp8 matmuls need a CUDA GPU of compute capability 8.9 or newer:
``tests/e2e/test_gpu.py``'s fp8 tests run them there."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from torch import nn

from omnibert.accelerators.base import AcceleratorPlugin
from omnibert.accelerators.cpu import CPUPlugin
from omnibert.accelerators.float8 import (
    INSTALL,
    Float8Error,
    check_float8,
    convert_to_float8,
    plan_float8,
    select_layers,
)
from omnibert.accelerators.gpu import GPUPlugin
from omnibert.apps import export as export_app
from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.config import FinetuneConfig, TrainConfig
from omnibert.config.sections import ConfigError, Float8Settings
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.models.heads import BertForSequenceClassification
from omnibert.run.pretraining import job as pretraining

#: the Linear layers of one encoder layer that run in fp8
LAYER_FP8 = (
    "attention.self.query", "attention.self.key", "attention.self.value",
    "attention.output.dense", "intermediate.dense", "output.dense",
)  # fmt: skip
#: experiment=smoke (1 layer, hidden 32, feed-forward 64: multiples of 16), 20 steps of 2
#: micro-batches, one evaluation at the end, the last checkpoint kept, per-step losses in CSV
PAIR = (
    "experiment=smoke", "phase.max_steps=20", "val_every_n_steps=20", "logger=csv",
    "callbacks.checkpoint.every_n_train_steps=20", "accelerator.threads=1",
)  # fmt: skip
#: the tolerances of the emulated-fp8 run against bf16 from the same seed and batches, stated
#: before the run: every step's training loss within 1 % of bf16's, and the weights' total
#: update within 25 % of bf16's (relative norm of the difference) in every fp8 layer
LOSS_RTOL = 0.01
UPDATE_RTOL = 0.25


def fp8_names(model: nn.Module) -> set[str]:
    return {n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}


def emulated(recipe: str = "tensorwise") -> Float8Settings:
    return Float8Settings(recipe, emulate=True)


@pytest.mark.parametrize(
    "fields",
    [
        {},  # BERT: post-norm, GELU feed-forward, biases, MLM + NSP
        {"feed_forward": "geglu", "bias": False, "norm_position": "pre",
         "next_sentence_head": False, "decoder_bias": False},  # the modern variants
    ],
    ids=["bert", "modern"],
)  # fmt: skip
def test_the_encoder_and_the_mlm_transform_become_float8_the_rest_stays(fields) -> None:
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, **fields)  # fmt: skip
    torch.manual_seed(0)
    model = BertForPreTraining(config)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.device("meta"):
        plan = plan_float8(emulated("rowwise"), "0", BertForPreTraining(config))
    swapped = convert_to_float8(model, plan)
    want = {f"bert.encoder.layer.{i}.{name}" for i in range(2) for name in LAYER_FP8}
    want.add("cls.predictions.transform.dense")
    assert set(swapped) == fp8_names(model) == want == set(plan.fp8_layers)
    kept = {"cls.predictions.decoder"}
    if config.next_sentence_head:
        kept |= {"bert.pooler.dense", "cls.seq_relationship"}
    assert set(plan.bf16_layers) == kept
    assert all(type(model.get_submodule(name)) is nn.Linear for name in kept)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    # the same tensors under the same names: checkpoints and exports are a bf16 run's
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(type(after[k]) is torch.Tensor and torch.equal(after[k], before[k]) for k in after)
    # forward and backward in bf16 autocast, gradients reach every fp8 layer
    batch = _batch(config.vocab_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(batch)["loss"]
    loss.backward()
    assert torch.isfinite(loss)
    assert all(model.get_submodule(n).weight.grad.abs().sum() > 0 for n in want)
    described = plan.describe()
    assert "13 linear layers in fp8" in described and "MLM decoder" in described


def _batch(vocab: int, rows: int = 2, seq: int = 16) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    positions = torch.arange(seq).expand(rows, -1)
    return {
        "input_ids": torch.randint(5, vocab, (rows, seq), generator=generator),
        "segment_ids": (positions >= seq // 2).long(),
        "position_ids": positions,
        "sequence_ids": torch.ones(rows, seq, dtype=torch.long),
        "masked_lm_positions": torch.tensor([[1, 3, 5]] * rows),
        "masked_lm_ids": torch.randint(5, vocab, (rows, 3), generator=generator),
        "masked_lm_weights": torch.ones(rows, 3),
        "nsp_positions": torch.zeros(rows, 1, dtype=torch.long),
        "nsp_labels": torch.zeros(rows, 1, dtype=torch.long),
        "nsp_weights": torch.ones(rows, 1),
    }


def test_layers_whose_sizes_are_not_multiples_of_16_stay_bf16_with_the_reason() -> None:
    config = BertConfig(vocab_size=100, hidden_size=40, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64)  # fmt: skip
    with torch.device("meta"):
        fp8, kept = select_layers(BertForPreTraining(config))
    assert fp8 == []  # every compute layer reads or writes 40 columns
    assert kept["bert.encoder.layer.0.attention.self.query"] == (
        "40x40: dimensions not multiples of 16"
    )
    assert kept["bert.encoder.layer.0.intermediate.dense"].startswith("64x40: ")
    assert kept["cls.predictions.transform.dense"].startswith("40x40: ")


def test_a_fine_tuning_model_keeps_its_pooler_and_classifier_bf16() -> None:
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64)  # fmt: skip
    with torch.device("meta"):
        fp8, kept = select_layers(BertForSequenceClassification(config, 3))
    assert fp8 == [f"bert.encoder.layer.0.{name}" for name in LAYER_FP8]
    assert set(kept) == {"bert.pooler.dense", "classifier"}


# ---------------------------------------------------------------------------- refusals
def test_fp8_is_refused_on_the_cpu_without_emulation_naming_the_device_and_bf16(
    tmp_path, capsys
) -> None:
    cfg = compose("pretrain", ["experiment=smoke", "trainer=fp8", f"paths.output_root={tmp_path}"])
    with pytest.raises(SystemExit) as exit_info:
        run_or_exit(cfg, tmp_path / "out")
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the CPU (accelerator=cpu)" in message and "compute capability 8.9" in message
    assert "trainer.precision=bf16-mixed" in message
    assert not (tmp_path / "smoke" / "checkpoints").exists()


def test_fp8_is_refused_below_compute_capability_8_9(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (8, 0))
    with pytest.raises(Float8Error, match=r"A100-SXM4-80GB, compute capability 8\.0.*bf16-mixed"):
        check_float8(GPUPlugin(compile=False), emulate=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    assert check_float8(GPUPlugin(compile=False), emulate=False)  # an H100: torchao's version


@pytest.mark.parametrize("kind", ["an Intel Gaudi HPU", "a Graphcore IPU"])
def test_vendor_backends_refuse_fp8_even_emulated(kind) -> None:
    plugin = AcceleratorPlugin()
    plugin.name, plugin.device_kind, plugin.fp8_emulation = "hpu", kind, False
    with pytest.raises(Float8Error, match=f"{kind}.*bf16-mixed"):
        check_float8(plugin, emulate=False)
    with pytest.raises(Float8Error, match=f"emulate=true.*{kind}.*bf16-mixed"):
        check_float8(plugin, emulate=True)


def test_fp8_without_torchao_names_the_install_command(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    cfg = compose("pretrain", ["experiment=smoke", "trainer=fp8", "trainer.fp8.emulate=true",
                               f"paths.output_root={tmp_path}"])  # fmt: skip
    with pytest.raises(Float8Error) as refused:
        pretraining.prepare(TrainConfig.of(cfg))
    assert INSTALL in str(refused.value) and "bf16-mixed" in str(refused.value)
    with pytest.raises(Float8Error):
        check_float8(CPUPlugin(), emulate=True)


def test_fp8_keys_with_another_precision_are_refused_not_ignored() -> None:
    with pytest.raises(ConfigError, match=r"trainer.fp8.recipe=rowwise applies to "
                       r"trainer.precision=fp8 only.*bf16-mixed"):  # fmt: skip
        Float8Settings.of({"recipe": "rowwise"}, "bf16-mixed")
    with pytest.raises(ConfigError, match=r"trainer\.fp8\.recipe='blockwise' is not one of"):
        Float8Settings.of({"recipe": "blockwise"}, "fp8")
    assert Float8Settings.of({"recipe": "rowwise", "emulate": True}, "fp8") == emulated("rowwise")


# ---------------------------------------------------------------------------- training
def _train(root: Path, *overrides: str) -> dict[str, Any]:
    """A :data:`PAIR` run through omnibert-train's own functions: the losses per step, the
    weights before and after, the plan and the last checkpoint."""
    cfg = compose("pretrain", [*PAIR, f"paths.output_root={root}", *overrides])
    prepared = pretraining.prepare(TrainConfig.of(cfg))
    run = pretraining.build(prepared, root / "out")
    start = {k: v.detach().clone() for k, v in run.task.model.state_dict().items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = pretraining.fit(run)
    finally:
        torch.set_num_threads(threads)
    (metrics,) = root.rglob("metrics.csv")
    with metrics.open() as rows:
        losses = [float(r["train/loss"]) for r in csv.DictReader(rows) if r.get("train/loss")]
    return {
        "summary": summary,
        "losses": losses,
        "start": start,
        "end": {k: v.detach().clone() for k, v in run.task.model.state_dict().items()},
        "model": run.task.model,
        "checkpoint": Path(summary["last_checkpoint"]),
        "root": root,
    }


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """The same 20 steps (seed, data, dropout) in bf16 and in emulated fp8 (tensorwise)."""
    return {
        name: _train(tmp_path_factory.mktemp(name), *overrides)
        for name, overrides in (
            ("bf16", ("trainer=bf16",)),
            ("fp8", ("trainer=fp8", "trainer.fp8.emulate=true")),
        )
    }


def test_an_emulated_fp8_run_tracks_the_same_run_in_bf16(pair) -> None:
    bf16, fp8 = pair["bf16"], pair["fp8"]
    plan = fp8["summary"]["plan"]
    assert plan["precision"] == "fp8" and plan["float8"]["recipe"] == "tensorwise"
    assert plan["float8"]["emulate"] is True
    assert plan["kernels"]["precision"].startswith(
        f"fp8 (torchao {plan['float8']['torchao']} float8, tensorwise: 7 linear layers in fp8; "
        "embeddings, norms, pooler, MLM decoder, NSP head in bf16"
    )
    assert fp8_names(fp8["model"]) == set(plan["float8"]["fp8_layers"])
    assert not fp8_names(bf16["model"])
    assert len(fp8["losses"]) == len(bf16["losses"]) == 20
    assert fp8["start"].keys() == bf16["start"].keys()
    assert all(torch.equal(fp8["start"][k], bf16["start"][k]) for k in fp8["start"])
    for step, (a, b) in enumerate(zip(fp8["losses"], bf16["losses"], strict=True)):
        assert abs(a - b) <= LOSS_RTOL * b, (step, a, b)
    # the updates, layer by layer: an fp8 layer whose gradients were lost or wrong would not
    # move as its bf16 twin did
    for name in plan["float8"]["fp8_layers"]:
        key = f"{name}.weight"
        ours = fp8["end"][key] - fp8["start"][key]
        want = bf16["end"][key] - bf16["start"][key]
        assert want.norm() > 0
        assert (ours - want).norm() <= UPDATE_RTOL * want.norm(), name
    assert fp8["summary"]["validation"]["val/loss"] == pytest.approx(
        bf16["summary"]["validation"]["val/loss"], rel=LOSS_RTOL
    )


def test_an_fp8_checkpoint_holds_what_a_bf16_one_holds(pair) -> None:
    saved = {name: torch.load(run["checkpoint"], weights_only=True) for name, run in pair.items()}
    fp8, bf16 = saved["fp8"]["state_dict"], saved["bf16"]["state_dict"]
    assert list(fp8) == list(bf16)
    for key, tensor in fp8.items():
        assert type(tensor) is torch.Tensor, key  # no torchao tensor subclass
        assert (tensor.dtype, tensor.shape) == (bf16[key].dtype, bf16[key].shape), key
    states = [s["optimizer_states"][0]["state"] for s in saved.values()]
    assert states[0].keys() == states[1].keys()
    assert saved["fp8"]["hyper_parameters"] == saved["bf16"]["hyper_parameters"]


@pytest.mark.parametrize(
    ("written", "resumed"),
    [("fp8", ("trainer=fp8", "trainer.fp8.emulate=true")), ("fp8", ("trainer=bf16",)),
     ("bf16", ("trainer=fp8", "trainer.fp8.emulate=true"))],
    ids=["fp8-to-fp8", "fp8-to-bf16", "bf16-to-fp8"],
)  # fmt: skip
def test_a_run_resumes_across_precisions(pair, tmp_path, written, resumed) -> None:
    import shutil

    root = tmp_path / "run"
    shutil.copytree(pair[written]["root"], root)
    cfg = compose("pretrain", [*PAIR, f"paths.output_root={root}", "phase.max_steps=22",
                               "ckpt_path=last", "logger=none", *resumed])  # fmt: skip
    prepared = pretraining.prepare(TrainConfig.of(cfg))
    assert prepared.plan.ckpt_path.endswith("last.ckpt")
    run = pretraining.build(prepared, root / "out")
    summary = pretraining.fit(run)
    fp8 = resumed[0] == "trainer=fp8"
    assert summary["steps"] == 22 and summary["plan"]["precision"] == (
        "fp8" if fp8 else "bf16-mixed"
    )
    assert bool(fp8_names(run.task.model)) == fp8
    assert torch.isfinite(torch.tensor(summary["validation"]["val/loss"]))


def test_an_fp8_checkpoint_exports_to_transformers(pair, tmp_path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"tok{i}\n" for i in range(128)))  # experiment=smoke: 128 tokens
    out = tmp_path / "hf"
    checkpoint = pair["fp8"]["checkpoint"]
    export_app.run(compose("export", [f"ckpt={checkpoint}", f"out={out}", f"vocab_file={vocab}"]))
    # the default export: BertForMaskedLM (the pooler and NSP head left out)
    hf, info = transformers.BertForMaskedLM.from_pretrained(str(out), output_loading_info=True)
    assert not any(info.values()), info
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    query = "bert.encoder.layer.0.attention.self.query.weight"
    assert torch.equal(hf.state_dict()[query], saved[f"model.{query}"])


def test_fine_tuning_trains_in_fp8_through_the_shared_pipeline(tmp_path, tiny_hf) -> None:
    from finetune_data import mrpc_file

    from omnibert.run.finetuning import job as finetuning

    train = mrpc_file(tmp_path / "train.tsv", 8, 1)
    cfg = compose("finetune", [
        "task=mrpc", f"data.train_file={train}", f"model.init_from={tiny_hf}",
        f"paths.output_root={tmp_path / 'runs'}", "task.batch_size=4", "task.epochs=1",
        "task.max_seq_length=32", "logger=none", "trainer.enable_progress_bar=false",
        "trainer=fp8", "trainer.fp8.emulate=true",
    ])  # fmt: skip
    prepared = finetuning.prepare(FinetuneConfig.of(cfg, FineTuneInputError))
    plan = prepared.plan
    assert plan.precision == "fp8" and plan.kernels["precision"].startswith("fp8 (torchao ")
    assert set(plan.float8.bf16_layers) == {"bert.pooler.dense", "classifier"}
    run = finetuning.build(prepared, tmp_path / "out")
    assert fp8_names(run.task.model) == set(plan.float8.fp8_layers)
    assert len(plan.float8.fp8_layers) == 2 * len(LAYER_FP8)  # tiny_hf: 2 layers
    facts = finetuning.fit(run)
    assert facts["steps"] == 2 and facts["train_loss_last"] is not None
    saved = torch.load(facts["checkpoint"], weights_only=True)["state_dict"]
    assert all(type(t) is torch.Tensor for t in saved.values())


def test_compile_only_measures_the_fp8_step(tmp_path, monkeypatch) -> None:
    from omnibert.run.sizing import compile_only

    swapped: list[list[str]] = []
    convert = compile_only.convert_to_float8
    monkeypatch.setattr(
        compile_only, "convert_to_float8", lambda m, p: swapped.append(convert(m, p)) or []
    )
    cfg = compose("pretrain", ["experiment=smoke", "compile_only=true", "trainer=fp8",
                               "trainer.fp8.emulate=true", f"paths.output_root={tmp_path}"])  # fmt: skip
    report = run_or_exit(cfg, tmp_path / "out")
    assert report["precision"] == "fp8" and report["measured"]["ran_steps"] == 2
    assert len(swapped) == 1 and len(swapped[0]) == len(LAYER_FP8) + 1  # 1 layer + transform
