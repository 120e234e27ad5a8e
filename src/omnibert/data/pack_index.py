"""Reading the offline pack index ``omnibert-prepare ... pack.enabled=true`` writes next to the
shards (:mod:`omnibert.prepare.pack_index` builds it): which dataset rows share a packed row.

Layout::

    <data_dir>/packs/<name>/          name defaults to "<algorithm>-k<K>"
      packs.npy      int32 [num_packs, K] (int64 from 2**31 rows): dataset rows of each pack,
                     longest first, -1 in unused slots; packs in a seeded shuffled order
      packing.json   format, data fingerprint, settings and pack statistics

:func:`load_pack_index` checks an index against the data it will index before training
uses it; :func:`row_lengths` reads the tokens and masked positions of every row from the
Arrow offsets (online packing and the index builder both need them). Vectorised NumPy only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from omnibert.errors import UserError

FORMAT_NAME = "omnibert-pack-index"
FORMAT_VERSION = 1
PACKS_DIR = "packs"
ARRAY_FILE = "packs.npy"
INFO_FILE = "packing.json"
Ints = npt.NDArray[np.int64]

__all__ = ["PackIndex", "PackIndexError", "array_problem", "load_pack_index", "row_lengths"]


class PackIndexError(UserError):
    """A problem with the data directory, the pack settings or a stored index, in one sentence."""


@dataclass(frozen=True, eq=False)
class PackIndex:
    """A pack index: ``packs[p]`` are the dataset rows of pack p (-1 = unused slot)."""

    packs: npt.NDArray[np.integer[Any]]
    info: dict[str, Any] = field(repr=False)
    path: Path


def default_name(algorithm: str, max_sequences_per_pack: int) -> str:
    return f"{algorithm}-k{max_sequences_per_pack}"


def rebuild_hint(data_dir: Path, max_sequences_per_pack: int, name: str | None = None) -> str:
    """The omnibert-prepare command that (re)builds index `name` (default: the default name)
    for `max_sequences_per_pack`."""
    command = f"omnibert-prepare output_dir={data_dir} pack.enabled=true"
    default = re.fullmatch(r"(.+)-k(\d+)", name or "")
    if default and default.group(1) != "lpfhp":
        command += f" pack.algorithm={default.group(1)}"
    command += f" pack.max_sequences_per_pack={max_sequences_per_pack}"
    if name and not (default and int(default.group(2)) == max_sequences_per_pack):
        command += f" pack.name={name}"
    return command


def row_lengths(dataset: Any) -> tuple[Ints, Ints]:
    """Tokens and masked positions of every row, read from the Arrow list offsets.

    `dataset` is a ``datasets.Dataset`` (row order honours a ``select``/``shuffle`` indices
    mapping) or a ``pyarrow.Table``. No Python loop over rows and no copy of token values.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    table = dataset if isinstance(dataset, pa.Table) else dataset.data.table
    indices = getattr(dataset, "_indices", None)
    out = []
    for column in ("input_ids", "masked_lm_positions"):
        lengths = pc.fill_null(pc.list_value_length(table.column(column)), 0)
        array = np.asarray(lengths.to_numpy(), dtype=np.int64)
        if indices is not None:
            array = array[np.asarray(indices.column(0).to_numpy(), dtype=np.int64)]
        out.append(array)
    return out[0], out[1]


def array_problem(packs: Any, rows: int, num_packs: Any, width: int) -> str | None:
    """What is wrong with a stored ``packs.npy`` (None when nothing): dtype, shape, row
    numbers in range, -1 only in trailing slots, no empty pack, every row exactly once."""
    if not isinstance(packs, np.ndarray) or packs.dtype not in (np.int32, np.int64):
        return f"dtype {getattr(packs, 'dtype', type(packs).__name__)}, not int32/int64"
    if packs.ndim != 2 or packs.shape != (num_packs, width):
        return f"shape {packs.shape}, not ({num_packs}, {width}) as packing.json says"
    valid = packs >= 0
    if np.any(packs < -1) or np.any(packs >= rows):
        return f"row numbers outside 0..{rows - 1}"
    if packs.shape[0] and (not valid[:, 0].all() or np.any(valid[:, 1:] > valid[:, :-1])):
        return "an empty pack or a -1 before a row number"
    if np.any(np.bincount(packs[valid].astype(np.int64), minlength=rows) != 1):
        return "rows missing or listed twice"
    return None


def load_pack_index(
    data_dir: str | Path,
    name: str,
    *,
    rows: int,
    fingerprint: str,
    max_sequence_length: int,
    max_sequences_per_pack: int,
) -> PackIndex:
    """Read ``<data_dir>/packs/<name>/`` and check it against the data it will index: format,
    version, fingerprint, rows, S, K and the array (see `array_problem`). Token sums per pack
    are checked when the index is built."""
    data_dir = Path(data_dir)
    path = data_dir / PACKS_DIR / name
    info_path, array_path = path / INFO_FILE, path / ARRAY_FILE
    rebuild = f"{rebuild_hint(data_dir, max_sequences_per_pack, name)} pack.overwrite=true"
    if not info_path.is_file():
        raise PackIndexError(
            f"{path} holds no pack index ({INFO_FILE} is missing); build it with "
            f"{rebuild_hint(data_dir, max_sequences_per_pack, name)}."
        )
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise PackIndexError(
            f"{info_path} cannot be read ({err}); rebuild it with {rebuild}."
        ) from err
    if not isinstance(info, dict):
        info = {}
    built_k = info.get("max_sequences_per_pack")
    if info.get("format") == FORMAT_NAME and built_k != max_sequences_per_pack:
        raise PackIndexError(
            f"{info_path} was built for max_sequences_per_pack={built_k!r} but "
            f"data.pack.max_sequences_per_pack is {max_sequences_per_pack}; set it to "
            f"{built_k} or run {rebuild_hint(data_dir, max_sequences_per_pack)}."
        )
    for key, expected, what in (
        ("format", FORMAT_NAME, "is not a pack index"),
        ("format_version", FORMAT_VERSION, "is a format this omnibert cannot read"),
        ("data_fingerprint", fingerprint, "was built for other data (it was prepared again)"),
        ("rows", rows, "indexes another number of rows than the data holds"),
        ("max_sequence_length", max_sequence_length, "was built for another sequence length"),
    ):
        if info.get(key) != expected:
            raise PackIndexError(
                f"{info_path} {what} ({key}={info.get(key)!r}, expected {expected!r}); "
                f"rebuild it with {rebuild}."
            )
    try:
        packs = np.load(array_path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise PackIndexError(
            f"{array_path} cannot be read ({type(err).__name__}); rebuild it with {rebuild}."
        ) from err
    problem = array_problem(packs, rows, info.get("num_packs"), max_sequences_per_pack)
    if problem is not None:
        raise PackIndexError(f"{array_path} is corrupt ({problem}); rebuild it with {rebuild}.")
    return PackIndex(packs=packs, info=info, path=path)
