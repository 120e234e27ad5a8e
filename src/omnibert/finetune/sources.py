"""Where a fine-tuning split comes from: a Hub name, a local directory in the Hub's layout,
or a file, all returned as a ``datasets.Dataset`` with the Hub's columns.

* No file given: ``datasets.load_dataset(data.dataset or task.data.hub, task.data.config,
  split=...)``: the Hub name (``nyu-mll/glue`` + ``cola``, ``rajpurkar/squad``) through the
  Hugging Face cache (``data.cache_dir``, else ``HF_DATASETS_CACHE`` / ``HF_HOME``), offline
  when ``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``; or a local directory in the Hub's
  layout (``<config>/<split>-00000-of-00001.parquet`` under a ``README.md`` naming the
  configs), which loads through the same call. A split written ``<config>/<split>`` comes from
  another config of the same dataset (GLUE's ``ax/test``).
* A file (``data.train_file``, ``data.eval_file``, ``data.test_file``): Parquet with the Hub's
  columns (``load_dataset("parquet", ...)``), a Hub-layout directory, or the original format
  read by the task (:meth:`omnibert.finetune.spec.TaskData.read_file`: SQuAD JSON, GLUE TSV).
  ``eval_file``/``test_file`` may be a mapping ``{split name: file}`` for tasks with several
  (MNLI: ``{matched: dev_matched.tsv, mismatched: dev_mismatched.tsv}``).

Before the first load by Hub name, the Hub (``HF_ENDPOINT``) is asked once whether it
answers (:func:`hub_unreachable`: one HTTP request, ``OMNIBERT_HUB_TIMEOUT`` seconds, default
2). When it does not (no network, a firewall, a proxy that cannot reach it), the dataset is
loaded as with ``HF_DATASETS_OFFLINE=1``: from the cache when it is there, else one sentence
at once; without that check ``datasets`` retries every request for about half a minute.

Every problem (a missing file, a dataset not cached while offline, a split the dataset lacks)
is one sentence naming the key or dataset and how to provide the files. ``datasets`` does not
import torch, so all of this runs before the heavy imports.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from huggingface_hub import constants

from omnibert.finetune.spec import TaskData
from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["file_for", "hub_unreachable", "load_split", "offline"]

ROLE_KEYS = {"train": "data.train_file", "eval": "data.eval_file", "test": "data.test_file"}
#: the environment variable that sets how long the Hub gets to answer (seconds)
HUB_TIMEOUT_ENV = "OMNIBERT_HUB_TIMEOUT"
HUB_TIMEOUT_S = 2.0


def offline() -> bool:
    """Whether the Hugging Face libraries were told not to reach the Hub."""
    import datasets  # lazy: datasets takes most of a second to import

    flags = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    env = any(os.environ.get(f, "").upper() in ("1", "ON", "YES", "TRUE") for f in flags)
    return env or bool(getattr(datasets.config, "HF_HUB_OFFLINE", False))


def hub_timeout() -> float:
    """``OMNIBERT_HUB_TIMEOUT`` (seconds), else :data:`HUB_TIMEOUT_S`."""
    value = os.environ.get(HUB_TIMEOUT_ENV, "").strip()
    if not value:
        return HUB_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise FineTuneInputError(
            f"{HUB_TIMEOUT_ENV}={value} is not a positive number of seconds; fix or unset it."
        )
    return seconds


def hub_endpoint() -> str:
    """The Hub ``datasets`` talks to (``HF_ENDPOINT``, else huggingface.co)."""
    return str(constants.ENDPOINT).rstrip("/")


def hub_unreachable() -> str | None:
    """None when the Hub answers one HTTP request (any status below 500) within
    :func:`hub_timeout` seconds; else what happened, as a phrase for a sentence. Asked once
    per endpoint and timeout in a process."""
    return _probe(hub_endpoint(), hub_timeout())


@cache
def _probe(endpoint: str, timeout: float) -> str | None:
    request = urllib.request.Request(f"{endpoint}/", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError as err:  # it answered; 5xx: it cannot serve (or a proxy)
        return None if err.code < 500 else f"answered HTTP {err.code}"
    except TimeoutError:
        return f"did not answer within {timeout:g} s ({HUB_TIMEOUT_ENV})"
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, TimeoutError):
            return f"did not answer within {timeout:g} s ({HUB_TIMEOUT_ENV})"
        return f"cannot be reached ({reason})"


@contextmanager
def _offline_mode() -> Iterator[None]:
    """``datasets`` and ``huggingface_hub`` offline inside the block (as
    ``HF_HUB_OFFLINE=1`` makes them): the cache only, no request, no retries."""
    import datasets  # lazy: datasets takes most of a second to import

    before = (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = before


def file_for(data_cfg: Mapping[str, Any], role: str, name: str, first: bool) -> tuple[Any, str]:
    """The file configured for split ``name`` of ``role`` (``train``/``eval``/``test``) and
    the key naming it; ``(None, key)`` when none is. A single file serves the first split."""
    key = ROLE_KEYS[role]
    value = data_cfg.get(key.split(".", 1)[1])
    if value is None or value == "":
        return None, key
    if isinstance(value, Mapping):
        return value.get(name), f"{key}.{name}"
    return (value if first else None), key


def _hub_hint(data: TaskData, role: str) -> str:
    fmt = "SQuAD JSON" if data.benchmark == "squad" else "GLUE TSV"
    return (
        f"pass the files instead ({ROLE_KEYS['train']}= and {ROLE_KEYS['eval']}=: {fmt} or "
        "Parquet with the Hub's columns), or data.dataset=<a local directory in the Hub's layout>"
    )


def load_split(
    data: TaskData,
    data_cfg: Mapping[str, Any],
    role: str,
    name: str,
    split: str,
    first: bool = True,
) -> tuple[Any, str]:
    """The split as a ``datasets.Dataset`` and a description of where it came from (for
    messages: the key and file, or the dataset name)."""
    file, key = file_for(data_cfg, role, name, first)
    cache_dir = data_cfg.get("cache_dir")
    if file is not None:
        return load_file(data, Path(str(file)), key, cache_dir), f"{key}={file}"
    source = str(data_cfg.get("dataset") or data.hub)
    config, hub_split = data.config, split
    if "/" in split:
        config, hub_split = split.split("/", 1)
    where = f"{source} ({config}, split {hub_split})" if config else f"{source} ({hub_split})"
    return _load_dataset(data, source, config, hub_split, cache_dir, role, where), where


def load_file(data: TaskData, path: Path, key: str, cache_dir: Any) -> Any:
    if path.is_dir():
        if not (path / "README.md").is_file() and not any(path.rglob("*.parquet")):
            raise FineTuneInputError(
                f"{key}={path} is a directory without a README.md or Parquet files; pass a "
                "file, or a directory in the Hub's layout as data.dataset."
            )
        raise FineTuneInputError(
            f"{key}={path} is a directory; a directory in the Hub's layout is data.dataset="
            f"{path} (with no {key}), a split is one file."
        )
    if not path.is_file():
        raise FineTuneInputError(
            f"{key}={path} does not exist; point it at the task's file, or leave it unset to "
            f"load {data.hub} ({data.config or 'default'}) through datasets."
        )
    if path.suffix == ".parquet":
        import datasets  # lazy: datasets takes most of a second to import

        try:
            return datasets.load_dataset(
                "parquet", data_files=str(path), split="train", cache_dir=cache_dir
            )
        except Exception as err:  # pyarrow's errors vary: one sentence with the first line
            raise FineTuneInputError(
                f"{key}={path} is not a readable Parquet file ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}); pass the task's file."
            ) from err
    return data.read_file(path, key)


def _load_dataset(
    data: TaskData,
    source: str,
    config: str | None,
    split: str,
    cache_dir: Any,
    role: str,
    where: str,
) -> Any:
    import datasets  # lazy: datasets takes most of a second to import

    local = Path(source).is_dir()
    unreachable = None if local or offline() else hub_unreachable()
    try:
        if unreachable is None:
            return datasets.load_dataset(source, config, split=split, cache_dir=cache_dir)
        with _offline_mode():  # from the cache, or at once one sentence below
            return datasets.load_dataset(source, config, split=split, cache_dir=cache_dir)
    except ValueError as err:
        text = str(err)
        if "BuilderConfig" in text and "not found" in text:
            available = text.split("Available:", 1)[-1].strip().rstrip(".") or "none"
            raise FineTuneInputError(
                f"{where}: {source} has no config {config!r} (it has {available}); "
                + (
                    f"add {config}/<split>-00000-of-00001.parquet and name it in its README.md"
                    if local
                    else _hub_hint(data, role)
                )
                + "."
            ) from err
        if "Unknown split" in text or ("split" in text.lower() and "not" in text.lower()):
            raise FineTuneInputError(
                f"{where}: the dataset has no split {split!r}; "
                + (
                    f"add {config}/{split}-00000-of-00001.parquet to {source}"
                    if local
                    else _hub_hint(data, role)
                )
                + "."
            ) from err
        raise FineTuneInputError(
            f"{where} could not be loaded ({text.splitlines()[0]}); {_hub_hint(data, role)}."
        ) from err
    except (FileNotFoundError, ConnectionError, OSError) as err:
        if local:
            raise FineTuneInputError(
                f"data.dataset={source} is not a dataset in the Hub's layout for config "
                f"{config} ({type(err).__name__}); it needs {config}/<split>-*.parquet and a "
                "README.md naming the configs."
            ) from err
        if unreachable is not None:
            raise FineTuneInputError(
                f"the Hugging Face Hub ({hub_endpoint()}) {unreachable} and the dataset "
                f"{source} ({config or 'default'}) is not in the cache "
                f"({cache_dir or datasets.config.HF_DATASETS_CACHE}); {_hub_hint(data, role)}."
            ) from err
        if offline():
            raise FineTuneInputError(
                f"the dataset {source} ({config or 'default'}) is not in the Hugging Face cache "
                f"({cache_dir or datasets.config.HF_DATASETS_CACHE}) and HF_DATASETS_OFFLINE/"
                f"HF_HUB_OFFLINE is set; run once online to cache it, or {_hub_hint(data, role)}."
            ) from err
        raise FineTuneInputError(
            f"the dataset {source} ({config or 'default'}) could not be downloaded "
            f"({type(err).__name__}); check the network or the name, or "
            f"{_hub_hint(data, role)}."
        ) from err
