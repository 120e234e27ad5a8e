"""Test helper: the records of an offline W&B run file (``run-<id>.wandb``).

wandb >= 0.2x writes them from its Go core and ships no Python reader, so this reads the
format itself: a 7-byte header (``:W&B``, magic 0xBEE1, version) then LevelDB log records in
32 KiB blocks (4-byte checksum, 2-byte little-endian length, 1-byte type: full, first,
middle, last), each payload a ``wandb_internal_pb2.Record``."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768


def _payloads(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield payload
        elif kind == 2:
            pending = payload
        elif kind == 3:
            pending += payload
        elif kind == 4:
            yield pending + payload


def _key(item: Any) -> str:
    return str(item.key) or "/".join(item.nested_key)


def _value(item: Any) -> Any:
    if item.value_json:
        return json.loads(item.value_json)
    kind = item.WhichOneof("value") if hasattr(item, "WhichOneof") else None
    return getattr(item, kind) if kind else None


def read_run(path: Path) -> dict[str, Any]:
    """``{"run": {id, group, tags, name}, "config": {key: value}, "history": [{key: value}]}``."""
    from wandb.proto import wandb_internal_pb2

    out: dict[str, Any] = {"run": {}, "config": {}, "history": []}
    for payload in _payloads(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out["run"] = {"id": run.run_id, "group": run.run_group, "tags": list(run.tags),
                          "name": run.display_name}  # fmt: skip
        elif kind == "config":
            for item in record.config.update:
                out["config"][_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append({_key(i): _value(i) for i in record.history.item})
    return out


def _finished(path: Path) -> bool:
    from wandb.proto import wandb_internal_pb2

    for payload in _payloads(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "exit":
            return True
    return False


def offline_runs(log_dir: Path, wait_s: float = 900.0) -> list[dict[str, Any]]:
    """Every offline run under ``<log_dir>/wandb``, oldest first, each read once W&B's core
    has written its ``exit`` record (``Run.finish`` returns before the file is complete; on
    a loaded machine the core can take minutes, hence the generous bound, which only a
    core that never finishes reaches)."""
    import time

    files = sorted((log_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files, f"no offline W&B run under {log_dir / 'wandb'}"
    deadline = time.monotonic() + wait_s
    while not all(_finished(f) for f in files):
        assert time.monotonic() < deadline, f"W&B never finished writing {files}"
        time.sleep(0.2)
    return [read_run(f) for f in files]
