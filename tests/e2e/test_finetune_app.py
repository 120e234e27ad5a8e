"""omnibert-finetune's wiring with tiny models: every kind of init_from (Hugging Face directory,
omnibert pretraining .ckpt, TF1 prefix) loads the encoder and leaves a fresh head; bad input
is one sentence naming the file/key before compute (exit 2 from the CLI); a seed sweep gives
one run directory per seed and the sweep report's median / mean / std / min / max."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from finetune_data import mrpc_file, squad_file

from omnibert.apps import finetune
from omnibert.apps.compose import compose
from omnibert.checkpoints.reading import load_pretrained
from omnibert.errors import UserError

FIXTURES = Path(__file__).parents[1] / "fixtures"
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64)  # fmt: skip
FAST = ["task.epochs=1", "task.batch_size=8", "task.max_seq_length=32", "logger=none",
        "trainer.enable_progress_bar=false"]  # fmt: skip


@pytest.fixture(scope="module")
def mrpc_files(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("mrpc")
    return mrpc_file(tmp / "train.tsv", 16, seed=1), mrpc_file(tmp / "dev.tsv", 8, seed=2)


def _omnibert_ckpt(tmp: Path, vocab: Path) -> Path:
    from omnibert.tasks import PretrainingTask

    task = PretrainingTask({"vocab_size": 30522, **TINY}, vocab_file=str(vocab))
    path = tmp / "pretrain.ckpt"
    torch.save({"hyper_parameters": dict(task.hparams), "state_dict": task.state_dict()}, path)
    return path


def _tf1_prefix(tmp: Path) -> Path:
    for name in ("model.ckpt-7.index", "model.ckpt-7.data-00000-of-00001", "bert_config.json"):
        shutil.copy(FIXTURES / "tf1" / name, tmp / name)
    words = [f"w{i}" for i in range(95)]
    (tmp / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n"
    )
    return tmp / "model.ckpt-7"


@pytest.mark.parametrize("kind", ["huggingface", "omnibert", "tf1"])
def test_every_init_from_loads_the_encoder_and_a_fresh_head(kind, tiny_hf, mrpc_files, tmp_path,
                                                            bert_vocab_file):  # fmt: skip
    source = {
        "huggingface": lambda: tiny_hf,
        "omnibert": lambda: _omnibert_ckpt(tmp_path, bert_vocab_file),
        "tf1": lambda: _tf1_prefix(tmp_path),
    }[kind]()
    train, dev = mrpc_files
    cfg = compose("finetune", [
        "task=mrpc", f"data.train_file={train}", f"data.eval_file={dev}",
        f"model.init_from={source}", f"paths.output_root={tmp_path / 'runs'}", "task.lr=0.0",
        *FAST,
    ])  # fmt: skip
    summary = finetune.run(cfg)
    assert summary["new_keys"][:2] == ["classifier.weight", "classifier.bias"]
    # an HF export of BertForPreTraining has the pooler; so do the other two kinds
    assert not any(k.startswith("bert.pooler") for k in summary["new_keys"])
    state = torch.load(summary["checkpoint"], weights_only=True)["state_dict"]
    pretrained = load_pretrained(source, require_heads=False).model.bert.state_dict()
    for name, tensor in pretrained.items():  # lr 0: the encoder is the checkpoint's, exactly
        assert torch.equal(state[f"model.bert.{name}"], tensor), name
    head = state["model.classifier.weight"]
    assert head.abs().max() > 0 and 0.005 < head.std() < 0.05  # N(0, 0.02²)
    assert (Path(summary["run_dir"]) / "eval" / "validation.tsv").is_file()


def test_bad_inputs_are_one_sentence_naming_the_file_or_key(tmp_path, tiny_hf):
    tsv = mrpc_file(tmp_path / "train.tsv", 4, seed=1)
    no_data = tmp_path / "nodata.json"
    no_data.write_text(json.dumps({"version": "1.1", "articles": []}))
    base = [f"model.init_from={tiny_hf}", f"paths.output_root={tmp_path / 'runs'}"]
    cases = {
        f"data.train_file={tsv} is not JSON": ["task=squad", f"data.train_file={tsv}"],
        'has no top-level "data" list': ["task=squad", f"data.train_file={no_data}"],
        "is not task=mrpc's GLUE TSV": ["task=mrpc", f"data.train_file={no_data}"],
        "data.eval_file=missing.tsv does not exist": [
            "task=mrpc", f"data.train_file={tsv}", "data.eval_file=missing.tsv"],
    }  # fmt: skip
    for message, overrides in cases.items():
        with pytest.raises(UserError, match=re.escape(message)):
            finetune.run(compose("finetune", [*base, *overrides]))
    with pytest.raises(UserError, match=r"model\.init_from is not set"):
        finetune.run(compose("finetune", ["task=mrpc", f"data.train_file={tsv}"]))


def test_the_cli_refuses_before_compute_with_exit_code_2(tmp_path, tiny_hf):
    tsv = mrpc_file(tmp_path / "train.tsv", 4, seed=1)
    probe = (
        "import sys\nfrom omnibert.apps import finetune\nfrom omnibert.apps.compose import compose\n"
        "from omnibert.errors import UserError\n"
        f"cfg = compose('finetune', ['task=squad', 'data.train_file={tsv}', "
        f"'model.init_from={tiny_hf}'])\n"
        "try:\n    finetune.run(cfg)\nexcept UserError:\n    pass\n"
        "print('lightning' in sys.modules, 'tokenizers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)  # fmt: skip
    assert out.stdout.strip() == "False False", out.stderr  # refused before the heavy imports
    script = Path(sys.executable).parent / "omnibert-finetune"
    bad = subprocess.run([str(script), "task=nope", f"hydra.run.dir={tmp_path}/h"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "task" in bad.stderr and "squad" in bad.stderr


def test_a_seed_sweep_gives_a_run_per_seed_and_the_spread(tmp_path, tiny_hf, mrpc_files):
    train, dev = mrpc_files
    sweep = tmp_path / "sweep"
    script = Path(sys.executable).parent / "omnibert-finetune"
    out = subprocess.run(
        [str(script), "-m", "task=mrpc", f"data.train_file={train}", f"data.eval_file={dev}",
         f"model.init_from={tiny_hf}", "task.lr=5e-4", "seed=1,2,3", f"hydra.sweep.dir={sweep}",
         *FAST, "trainer.enable_progress_bar=true"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    # each message once per job, no avoidable warning, progress as lines (stdout is a pipe)
    both = out.stdout + out.stderr
    assert out.stdout.count("new (freshly initialised) keys: classifier.weight") == 3
    assert "fresh parameters" not in both and "GPU available" in both
    assert both.count("GPU available") == 3
    assert "LeafSpec" not in both and "log_every_n_steps" not in both
    assert "\r" not in both and out.stdout.count("omnibert-finetune: step 2/2 (100%)") == 3
    summaries = sorted(sweep.glob("*/summary.json"))
    assert len(summaries) == 3
    seeds = sorted(json.loads(p.read_text())["seed"] for p in summaries)
    assert seeds == [1, 2, 3]
    report = json.loads((sweep / "sweep_report.json").read_text())
    accuracies = [json.loads(p.read_text())["accuracy"] for p in summaries]
    spread = report["spread"]["accuracy"]
    assert set(spread) >= {"median", "mean", "min", "max", "stdev"}
    assert spread["mean"] == pytest.approx(sum(accuracies) / 3)
    assert spread["min"] == min(accuracies) and spread["max"] == max(accuracies)
    assert "accuracy: median" in out.stdout


def test_squad_template_files_are_valid_squad(tmp_path):
    from omnibert.finetune.squad_examples import read_squad

    examples = read_squad(squad_file(tmp_path / "t.json", 3, seed=5, odd_text=True), "f", True)
    assert len(examples) == 9
    for ex in examples:
        text, start = ex.answers[0]
        assert ex.context[start : start + len(text)] == text
