"""Rows as the loaders fetch them: a :class:`RowBlock` per batch from one Arrow gather
(:class:`ArrowRows`), where each row lives on disk (:class:`ShardMap`) and the error a row
that does not fit the batch raises (:class:`CollateError`), naming its shard and row.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import torch

from omnibert.errors import UserError

__all__ = ["ArrowRows", "CollateError", "RowBlock", "ShardMap", "flatten_packs"]

IntArray = npt.NDArray[np.int64]


class CollateError(UserError):
    """A row does not fit the batch settings; the message names the row and the fix."""


@dataclass(frozen=True)
class ShardMap:
    """Where the rows of a dataset live: row ``i`` is in ``files[k]`` for the first ``k``
    with ``i < ends[k]``; ``repair`` is the command that regenerates damaged files
    (``None``: the data has no recorded way to be regenerated)."""

    files: tuple[str, ...]
    ends: tuple[int, ...]
    repair: str | None = None

    @classmethod
    def of(
        cls, dataset: Any, records: Sequence[Mapping[str, Any]] | None, repair: str | None
    ) -> ShardMap:
        """The map of a memory-mapped ``datasets.Dataset``, its rows per file from
        ``records`` (metadata.json) when they list its files, else from the files."""
        from omnibert.data.integrity import arrow_rows

        files = tuple(str(entry["filename"]) for entry in dataset.cache_files)
        names = [Path(f).name for f in files]
        recorded = {str(r["filename"]): int(r["rows"]) for r in records or ()}
        rows = [
            recorded[n] if n in recorded else arrow_rows(f)
            for n, f in zip(names, files, strict=True)
        ]
        return cls(files, tuple(int(x) for x in np.cumsum(rows)), repair)

    def locate(self, index: int) -> str:
        """``row R of <file>`` for dataset row ``index``."""
        k = bisect.bisect_right(self.ends, index)
        if k >= len(self.files):
            return f"row {index} (past the {self.ends[-1] if self.ends else 0} rows on disk)"
        start = self.ends[k - 1] if k else 0
        return f"row {index - start} of {self.files[k]}"

    @property
    def fix(self) -> str:
        """The end of a sentence: the repair command last (no full stop to copy with it)."""
        return f"repair it with: {self.repair}" if self.repair else "re-create it."


@dataclass(frozen=True)
class RowBlock:
    """Rows fetched in one Arrow ``take``: ``indices[i]`` is the dataset index of row i.

    ``pack_sizes`` (packed batches): the rows are sequences listed pack by pack, pack j
    holding the next ``pack_sizes[j]`` of them; ``None``: every row is its own pack.
    ``shards``: where the rows live, for error messages.
    """

    indices: IntArray
    table: pa.Table
    pack_sizes: IntArray | None = None
    shards: ShardMap | None = None

    def __len__(self) -> int:
        return len(self.indices)


def flatten_packs(indices: Sequence[Any]) -> tuple[IntArray, IntArray | None]:
    """A batch sampler's item → (flat dataset indices, sizes of the packs or ``None``).

    A list of ints is a batch of unpacked rows; a list of lists of ints is a batch of packs.
    """
    if len(indices) and isinstance(indices[0], (list, tuple, np.ndarray)):
        sizes = np.fromiter((len(pack) for pack in indices), dtype=np.int64, count=len(indices))
        flat = np.concatenate([np.asarray(p, dtype=np.int64).reshape(-1) for p in indices])
        return flat, sizes
    return np.asarray(indices, dtype=np.int64).reshape(-1), None


class ArrowRows(torch.utils.data.Dataset[dict[str, Any]]):
    """A map-style dataset over a Hugging Face ``datasets.Dataset`` of unpadded rows whose
    ``__getitems__`` (what the DataLoader calls with a batch of indices) returns a
    :class:`RowBlock` from one Arrow gather instead of building a Python dict per row.
    Picklable: a memory-mapped dataset pickles as its file paths. ``shards`` names the file
    and row of a bad row in errors."""

    def __init__(self, dataset: Any, shards: ShardMap | None = None) -> None:
        self.dataset = dataset
        self.shards = shards
        self._arrow = dataset.with_format("arrow")

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row: dict[str, Any] = self.dataset[int(index)]
        return row

    def __getitems__(self, indices: Sequence[Any]) -> RowBlock:
        """Rows ``indices`` (ints), or the sequences of a batch of packs (lists of ints)."""
        idx, sizes = flatten_packs(indices)
        try:
            table = self._arrow[idx.tolist()] if idx.size else self._arrow[0:0]
        except pa.ArrowException as err:  # damaged bytes that still map
            where = ", ".join(self.shards.locate(int(i)) for i in idx[:1]) if self.shards else ""
            raise CollateError(
                f"reading dataset rows {idx[:4].tolist()}{'...' if idx.size > 4 else ''} "
                f"{f'({where}) ' if where else ''}failed ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}); the data is damaged, "
                f"{self.shards.fix if self.shards else 're-create it.'}"
            ) from err
        return RowBlock(idx, table, sizes, self.shards)
