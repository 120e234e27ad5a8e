"""Fine-tuning data by Hub name when the Hub does not answer: it is asked once
(``omnibert.finetune.sources.hub_unreachable``), then the dataset loads as with
``HF_DATASETS_OFFLINE=1``: from the cache, or one sentence naming data.train_file and
data.dataset, without ``huggingface_hub``'s retries (about half a minute of them before).
No test here needs a network: the Hub is a local port that is closed, or one that accepts
connections and never answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from glue_data import hub_glue_dir

from omnibert.apps.compose import compose
from omnibert.config import FinetuneConfig
from omnibert.finetune import sources
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.run.finetuning.inputs import check_inputs


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _environment(tmp_path: Path, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY")}
    env.update({
        "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "*",
        "OMNIBERT_HUB_TIMEOUT": "0.5",
    })  # fmt: skip
    for flag in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(flag, None)
    return env


def _finetune(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "omnibert-finetune"
    return subprocess.run(
        [str(script), "task=sst2", "model.init_from=unused-by-the-checks",
         f"paths.output_root={tmp_path / 'runs'}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip


def test_a_hub_that_never_answers_is_asked_once_and_the_run_stops_in_one_sentence(tmp_path):
    """A port that accepts connections (the kernel's backlog) and never answers: the
    process connects once, waits OMNIBERT_HUB_TIMEOUT, and stops with exit code 2 and one
    line; the connections are counted from the backlog after the process ended."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]
        done = _finetune(tmp_path, _environment(tmp_path, f"http://127.0.0.1:{port}"))
        server.setblocking(False)
        accepted = []
        while True:
            try:
                accepted.append(server.accept()[0])
            except BlockingIOError:
                break
        for connection in accepted:
            connection.close()
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr  # one line: no retry warnings
    assert "retry" not in done.stderr.lower() and "retrying" not in done.stdout.lower()
    line = done.stderr.strip()
    assert line.startswith("omnibert-finetune: error: the Hugging Face Hub (http://127.0.0.1:")
    assert "did not answer within 0.5 s (OMNIBERT_HUB_TIMEOUT)" in line
    assert "nyu-mll/glue (sst2) is not in the cache" in line
    assert "data.train_file=" in line and "data.dataset=" in line
    assert len(accepted) == 1  # the train split and the eval split: one question to the Hub


def test_a_closed_port_is_one_sentence_too(tmp_path):
    done = _finetune(tmp_path, _environment(tmp_path, f"http://127.0.0.1:{_closed_port()}"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "cannot be reached (" in done.stderr and "data.train_file=" in done.stderr


def test_an_unreachable_hub_loads_a_cached_dataset_and_leaves_the_libraries_online(
    tmp_path, monkeypatch
):
    import datasets
    from huggingface_hub import constants

    for flag in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("OMNIBERT_HUB_TIMEOUT", "0.5")
    # the cache as a load of nyu-mll/glue leaves it, filled from a Hub-layout directory
    datasets.load_dataset(str(hub_glue_dir(tmp_path / "glue", ["rte"])), "rte",
                          cache_dir=tmp_path / "cache")  # fmt: skip
    (tmp_path / "cache" / "glue").rename(tmp_path / "cache" / "nyu-mll___glue")
    inputs = check_inputs(FinetuneConfig.of(compose("finetune", [
        "task=rte", "model.init_from=unused-by-the-checks",
        f"paths.output_root={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}",
    ]), FineTuneInputError))  # fmt: skip
    assert inputs.where["train"] == "nyu-mll/glue (rte, split train)"
    assert len(inputs.train) == 24 and len(inputs.evals["validation"]) == 12
    assert sources.hub_unreachable() is not None
    # offline only for those loads: the libraries' own flags are as they were
    assert datasets.config.HF_HUB_OFFLINE is False and constants.HF_HUB_OFFLINE is False


def test_a_hub_timeout_that_is_not_a_number_is_one_sentence(monkeypatch):
    monkeypatch.setenv("OMNIBERT_HUB_TIMEOUT", "soon")
    with pytest.raises(FineTuneInputError, match="OMNIBERT_HUB_TIMEOUT=soon is not a positive"):
        sources.hub_timeout()
