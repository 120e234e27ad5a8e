"""Arrow shards of pretraining instances (HF ``datasets``), written so a crash never leaves a
half-written shard that looks complete.

Layout of an output directory once it is complete::

    output_dir/
      data-00000-00000.arrow ...   one or more Arrow files per input file, in input order
      dataset_info.json state.json written by ``datasets`` (``load_from_disk(output_dir)``)
      metadata.json                settings, hashes, counts, length histogram; written last

While work is in progress each input file's part is built in ``.parts/part-NNNNN.tmp-PID``
and renamed to ``.parts/part-NNNNN`` only when its Arrow files and ``part.json`` are on disk,
so a finished part is exactly a directory without ``.tmp`` in its name.  ``part.json`` and
later ``metadata.json["files"]`` hold each Arrow file's integrity record (rows, bytes,
CRC-32C, source inputs: :mod:`omnibert.data.integrity`); a part whose files do not match it
is redone.  ``metadata.json`` appears last, by atomic rename: its presence is what marks the
directory complete.  Input files that give no rows have a part but no Arrow file.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np
import pyarrow as pa

from omnibert.data.integrity import file_problems, file_record
from omnibert.data.schema import METADATA_FILE
from omnibert.paths import write_json_atomic

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
    """Write one input file's rows as ``.parts/part-{index}``, atomically; ``part.json``
    gets ``record`` plus the integrity record of each Arrow file (``files``)."""
    parts = output_dir / PARTS_DIR
    parts.mkdir(parents=True, exist_ok=True)
    final = parts / f"part-{index:05d}"
    tmp = parts / f"part-{index:05d}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    dataset = datasets.Dataset(table, info=datasets.DatasetInfo(features=feats))
    with quiet_datasets():
        dataset.save_to_disk(str(tmp), max_shard_size=max_shard_size)
    files = [file_record(tmp / name, [index]) for name in _data_files(tmp)]
    write_json_atomic(tmp / PART_FILE, {**record, "files": files})
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def _data_files(directory: Path) -> list[str]:
    """The Arrow files ``datasets`` wrote into ``directory``, in row order."""
    state = json.loads((directory / "state.json").read_text(encoding="utf-8"))
    return [entry["filename"] for entry in state["_data_files"]]


def part_dir(output_dir: Path, index: int) -> Path:
    return output_dir / PARTS_DIR / f"part-{index:05d}"


def read_part_record(output_dir: Path, index: int) -> dict[str, Any] | None:
    """The ``part.json`` of a finished part whose Arrow files are intact (sizes and CRC-32C
    as recorded), or None: the part is unfinished, was partly assembled or is damaged."""
    path = part_dir(output_dir, index) / PART_FILE
    if not path.is_file():
        return None
    record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    files = record.pop("files", None)
    if files is None or file_problems(path.parent, files, rows=False, checksums=True):
        return None  # written by an older version, interrupted while assembled, or damaged
    return record


def data_file_name(part: int, k: int) -> str:
    return f"data-{part:05d}-{k:05d}.arrow"


def clear_data_files(output_dir: Path, parts: Sequence[int] | None = None) -> None:
    """Delete the assembled Arrow files of ``parts`` (all of them with ``None``)."""
    patterns = ["data-*.arrow"] if parts is None else [f"data-{i:05d}-*.arrow" for i in parts]
    for pattern in patterns:
        for path in output_dir.glob(pattern):
            path.unlink()


def assemble(
    output_dir: Path, parts: Sequence[int], keep_rows: int | None = None
) -> list[dict[str, Any]]:
    """Move the finished ``parts``' Arrow files into ``output_dir`` (replacing what those
    parts had there) and return their integrity records; ``keep_rows`` (an eval set): only
    the first rows of ``parts`` in order, saved anew, replacing every Arrow file. The
    directory loads once :func:`write_state` lists the files."""
    if keep_rows is not None:
        with quiet_datasets():
            loaded = [datasets.load_from_disk(str(part_dir(output_dir, i))) for i in parts]
            merged = datasets.concatenate_datasets(loaded)
            selected = merged.select(range(min(keep_rows, len(merged))))
            staging = output_dir / PARTS_DIR / "selected"
            if staging.exists():
                shutil.rmtree(staging)
            selected.save_to_disk(str(staging))
        ends = np.cumsum([len(d) for d in loaded])
        kept = [i for i, start in zip(parts, [0, *ends[:-1]], strict=True) if start < keep_rows]
        clear_data_files(output_dir)
        records = []
        for k, name in enumerate(_data_files(staging)):
            target = output_dir / data_file_name(0, k)
            os.replace(staging / name, target)
            records.append(file_record(target, kept))
        shutil.copyfile(staging / "dataset_info.json", output_dir / "dataset_info.json")
        return records
    clear_data_files(output_dir, parts)
    records = []
    for i in parts:
        source = part_dir(output_dir, i)
        part_files = json.loads((source / PART_FILE).read_text(encoding="utf-8"))["files"]
        for k, entry in enumerate(part_files):
            name = data_file_name(i, k)
            os.replace(source / entry["filename"], output_dir / name)
            records.append({**entry, "filename": name})
        shutil.copyfile(source / "dataset_info.json", output_dir / "dataset_info.json")
    return records


def write_state(output_dir: Path, records: Sequence[dict[str, Any]], fingerprint: str) -> Any:
    """Write the ``datasets`` state listing ``records``' files, so
    ``datasets.load_from_disk(output_dir)`` loads them in this order, and return the dataset.
    The directory is not complete until :func:`complete` writes ``metadata.json``."""
    state: dict[str, Any] = {
        "_data_files": [{"filename": record["filename"]} for record in records],
        "_fingerprint": fingerprint,
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    write_json_atomic(output_dir / "state.json", state)
    with quiet_datasets():
        return datasets.load_from_disk(str(output_dir))


def complete(output_dir: Path, metadata: dict[str, Any]) -> None:
    """Write ``metadata.json`` (the completion mark) and drop the work directory."""
    write_json_atomic(output_dir / METADATA_FILE, metadata)
    shutil.rmtree(output_dir / PARTS_DIR, ignore_errors=True)
