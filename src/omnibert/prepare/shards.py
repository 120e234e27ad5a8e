"""Arrow shards of pretraining instances (HF ``datasets``), written so a crash never leaves a
half-written shard that looks complete.

Layout of an output directory once it is complete::

    output_dir/
      data-00000-00000.arrow ...   one or more Arrow files per input file, in input order
      dataset_info.json state.json written by ``datasets`` (``load_from_disk(output_dir)``)
      metadata.json                settings, hashes, counts, length histogram; written last

While work is in progress each input file's part is built in ``.parts/part-NNNNN.tmp-PID``
and renamed to ``.parts/part-NNNNN`` only when its Arrow files and ``part.json`` are on disk,
so a finished part is exactly a directory without ``.tmp`` in its name.  ``metadata.json``
appears last, by atomic rename: its presence is what marks the directory complete.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np
import pyarrow as pa

from omnibert.data.schema import METADATA_FILE

if TYPE_CHECKING:
    from omnibert.prepare.instances import InstanceArrays


@contextmanager
def quiet_datasets() -> Iterator[None]:
    """``datasets``' own progress bars off inside the block (omnibert-prepare's bar covers
    the work), restored afterwards: importing this module changes nothing."""
    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


PARTS_DIR = ".parts"
PART_FILE = "part.json"


def _list_array(values: np.ndarray, offsets: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    if offsets[-1] >= 2**31:
        raise ValueError("one input file produced over 2**31 tokens; split it into smaller files.")
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(values).cast(arrow_type)
    )


def to_table(instances: InstanceArrays, feats: datasets.Features) -> pa.Table:
    schema = feats.arrow_schema
    columns = {
        "input_ids": _list_array(
            instances.input_ids, instances.offsets, schema.field("input_ids").type.value_type
        ),
        "segment_ids": _list_array(instances.segment_ids(), instances.offsets, pa.int8()),
        "masked_lm_positions": _list_array(
            instances.masked_lm_positions,
            instances.mlm_offsets,
            schema.field("masked_lm_positions").type.value_type,
        ),
        "masked_lm_ids": _list_array(
            instances.masked_lm_ids,
            instances.mlm_offsets,
            schema.field("masked_lm_ids").type.value_type,
        ),
        "next_sentence_label": pa.array(instances.next_sentence_label.astype(np.int8)),
    }
    return pa.table(columns, schema=schema)


def write_part(
    output_dir: Path,
    index: int,
    table: pa.Table,
    feats: datasets.Features,
    record: dict[str, Any],
    max_shard_size: str | int,
) -> Path:
    """Write one input file's rows as ``.parts/part-{index}``, atomically."""
    parts = output_dir / PARTS_DIR
    parts.mkdir(parents=True, exist_ok=True)
    final = parts / f"part-{index:05d}"
    tmp = parts / f"part-{index:05d}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    dataset = datasets.Dataset(table, info=datasets.DatasetInfo(features=feats))
    with quiet_datasets():
        dataset.save_to_disk(str(tmp), max_shard_size=max_shard_size)
    write_json_atomic(tmp / PART_FILE, record)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def read_part_record(output_dir: Path, index: int) -> dict[str, Any] | None:
    """The ``part.json`` of a finished part, or None when the part is not finished."""
    part_dir = output_dir / PARTS_DIR / f"part-{index:05d}"
    path = part_dir / PART_FILE
    if not path.is_file():
        return None
    state = json.loads((part_dir / "state.json").read_text(encoding="utf-8"))
    if not all((part_dir / entry["filename"]).is_file() for entry in state["_data_files"]):
        return None  # interrupted while being assembled: redo it
    record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return record


def assemble(
    output_dir: Path, num_parts: int, fingerprint: str, keep_rows: int | None = None
) -> datasets.Dataset:
    """Move the finished parts' Arrow files into ``output_dir`` and write the ``datasets``
    state, so ``datasets.load_from_disk(output_dir)`` loads them in part order.  With
    ``keep_rows`` only the first rows in part order are kept (an eval set).  The directory
    is not complete until :func:`complete` writes ``metadata.json``."""
    part_dirs = [output_dir / PARTS_DIR / f"part-{i:05d}" for i in range(num_parts)]
    if keep_rows is not None:
        with quiet_datasets():
            parts = [datasets.load_from_disk(str(d)) for d in part_dirs]
            merged = datasets.concatenate_datasets(parts)
            selected = merged.select(range(min(keep_rows, len(merged))))
            staging = output_dir / PARTS_DIR / "selected"
            if staging.exists():
                shutil.rmtree(staging)
            selected.save_to_disk(str(staging))
        part_dirs = [staging]
    data_files: list[dict[str, str]] = []
    info_source = part_dirs[0] / "dataset_info.json"
    for part_number, part_dir in enumerate(part_dirs):
        state = json.loads((part_dir / "state.json").read_text(encoding="utf-8"))
        for k, entry in enumerate(state["_data_files"]):
            name = f"data-{part_number:05d}-{k:05d}.arrow"
            os.replace(part_dir / entry["filename"], output_dir / name)
            data_files.append({"filename": name})
    shutil.copyfile(info_source, output_dir / "dataset_info.json")
    state = {
        "_data_files": data_files,
        "_fingerprint": fingerprint,
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    write_json_atomic(output_dir / "state.json", state)
    return datasets.load_from_disk(str(output_dir))


def complete(output_dir: Path, metadata: dict[str, Any]) -> None:
    """Write ``metadata.json`` (the completion mark) and drop the work directory."""
    write_json_atomic(output_dir / METADATA_FILE, metadata)
    shutil.rmtree(output_dir / PARTS_DIR, ignore_errors=True)


def write_json_atomic(path: Path, payload: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, sort_keys=False)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def written_by_us(path: Path) -> bool:
    """Whether ``path`` (an entry of an output directory) is one omnibert-prepare writes."""
    # packs/: pack indexes (omnibert.prepare.pack_index) made for the data being replaced
    names = (METADATA_FILE, "state.json", "dataset_info.json", PARTS_DIR, "packs")
    return path.name in names or (path.name.startswith("data-") and path.suffix == ".arrow")


def remove_outputs(output_dir: Path) -> None:
    """Delete what a previous run of ours wrote (and nothing else)."""
    for path in output_dir.iterdir():
        if not written_by_us(path):
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
