"""Offline pack index: which dataset rows share a packed row, computed once and stored next
to the shards (``omnibert-prepare ... pack.enabled=true``).

The token data is never rewritten: an index is a small array of row numbers that the data
module reads to gather the sequences of each pack. Layout::

    <data_dir>/packs/<name>/          name defaults to "<algorithm>-k<K>"
      packs.npy      int32 [num_packs, K] (int64 from 2**31 rows): dataset rows of each pack,
                     longest first, -1 in unused slots; packs in a seeded shuffled order
      packing.json   format, data fingerprint, settings and pack statistics

An index is built in a temporary directory inside ``packs/`` and renamed into place, so a
crash leaves either the old index or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from omnibert.data.pack_index import (
    ARRAY_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    INFO_FILE,
    PACKS_DIR,
    Ints,
    PackIndex,
    PackIndexError,
    default_name,
    load_pack_index,
    row_lengths,
)
from omnibert.packing.budget import split_over_budget, to_matrix

__all__ = ["build_pack_index", "check_pack_settings", "pack_statistics"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]*")


def check_pack_settings(
    algorithm: str,
    max_sequences_per_pack: int,
    max_predictions_per_pack: int | None,
    name: str | None,
    options: dict[str, Any] | None,
) -> str:
    """Refuse bad `pack.*` settings before any work; returns the index name."""
    from omnibert.packing.api import ALGORITHMS, OPTIONS

    if algorithm not in ALGORITHMS:
        raise PackIndexError(
            f"pack.algorithm={algorithm!r} is not one of {sorted(ALGORITHMS)}; choose one of them."
        )
    for key, value in (
        ("pack.max_sequences_per_pack", max_sequences_per_pack),
        ("pack.max_predictions_per_pack", max_predictions_per_pack),
    ):
        if value is None and key.endswith("predictions_per_pack"):
            continue
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise PackIndexError(f"{key}={value!r} must be a positive integer; fix {key}.")
    unknown = sorted(set(options or {}) - OPTIONS[algorithm])
    if unknown:
        accepted = sorted(OPTIONS[algorithm]) or "none"
        raise PackIndexError(
            f"pack.options {unknown} are not options of pack.algorithm={algorithm} (it takes "
            f"{accepted}); remove them."
        )
    chosen = name if name is not None else default_name(algorithm, max_sequences_per_pack)
    if not _NAME.fullmatch(chosen):
        raise PackIndexError(
            f"pack.name={chosen!r} must be a plain directory name (letters, digits, '_.+=-'); "
            "fix pack.name."
        )
    return chosen


def read_metadata(data_dir: Path) -> dict[str, Any]:
    """``metadata.json`` of a finished omnibert-prepare output directory, or PackIndexError."""
    path = data_dir / "metadata.json"
    if not path.is_file():
        raise PackIndexError(
            f"{data_dir} has no metadata.json, so it is not a finished omnibert-prepare output "
            "directory; run omnibert-prepare into it first or fix output_dir."
        )
    try:
        meta: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise PackIndexError(f"{path} cannot be read ({err}); re-run omnibert-prepare.") from err
    if not isinstance(meta, dict) or meta.get("format") != "omnibert-pretraining":
        found = meta.get("format") if isinstance(meta, dict) else None
        raise PackIndexError(
            f"{path} has format={found!r}, not 'omnibert-pretraining'; point output_dir at "
            "omnibert-prepare output."
        )
    size = meta.get("settings", {}).get("max_seq_length")
    if not isinstance(size, int) or not isinstance(meta.get("fingerprint"), str):
        raise PackIndexError(
            f"{path} lacks settings.max_seq_length or fingerprint; re-run omnibert-prepare."
        )
    return meta


def _check_lengths(
    data_dir: Path, meta: dict[str, Any], lengths: npt.NDArray[np.int64], masks: Any
) -> None:
    """The rows must be the ones metadata.json describes (same histogram and mask count)."""
    settings, counts = meta.get("settings", {}), meta.get("counts", {})
    size = int(settings["max_seq_length"])
    histogram = np.asarray(meta.get("sequence_length_histogram", []), dtype=np.int64)
    found = np.bincount(lengths, minlength=size + 1) if lengths.size else np.zeros(size + 1)
    changed = (
        found.size != histogram.size
        or np.any(found != histogram)
        or counts.get("instances", lengths.size) != lengths.size
        or counts.get("masked", int(masks.sum())) != int(masks.sum())
    )
    if changed:
        raise PackIndexError(
            f"the Arrow rows in {data_dir} do not match its metadata.json (lengths or counts "
            "differ), so the data changed after omnibert-prepare wrote it; re-run "
            "omnibert-prepare into it."
        )


def _write_index(final: Path, packs: npt.NDArray[np.integer[Any]], info: dict[str, Any]) -> None:
    """Write the index in a temporary sibling, fsync it, then rename it to `final`."""
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    with open(tmp / ARRAY_FILE, "wb") as handle:
        np.save(handle, packs, allow_pickle=False)
        handle.flush()
        os.fsync(handle.fileno())
    with open(tmp / INFO_FILE, "w", encoding="utf-8") as handle:
        json.dump(info, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_dir(tmp)
    old = parent / f".{final.name}.old-{os.getpid()}"
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(parent)
    if old.exists():
        shutil.rmtree(old)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build_pack_index(
    data_dir: str | Path,
    *,
    algorithm: str = "lpfhp",
    max_sequences_per_pack: int = 3,
    max_predictions_per_pack: int | None = None,
    seed: int = 12345,
    name: str | None = None,
    overwrite: bool = False,
    options: dict[str, Any] | None = None,
    progress: bool = True,
) -> PackIndex:
    """Pack the rows of an omnibert-prepare output directory and store the index in
    ``<data_dir>/packs/<name>/``; returns it (``info["reused"]`` is True when an identical
    index was already there). With `max_predictions_per_pack`, packs holding more masked
    positions are split (see `split_over_budget`); without, the largest pack's count is
    recorded as the P a packed batch needs."""
    from omnibert.logs import progress_bar
    from omnibert.packing import pack_lengths

    start = time.perf_counter()
    data_dir = Path(data_dir)
    name = check_pack_settings(
        algorithm, max_sequences_per_pack, max_predictions_per_pack, name, options
    )
    options = dict(options or {})
    meta = read_metadata(data_dir)
    final = data_dir / PACKS_DIR / name
    wanted = {
        "algorithm": algorithm,
        "options": options,
        "seed": seed,
        "max_sequences_per_pack": max_sequences_per_pack,
        "mask_budget": max_predictions_per_pack,
    }
    if (final / INFO_FILE).is_file() and not overwrite:
        existing = _reusable(data_dir, name, meta, wanted)
        if existing is not None:
            return existing
        raise PackIndexError(
            f"{final} already holds a pack index built with other settings or data; pass "
            "pack.overwrite=true to replace it or choose another pack.name."
        )
    size = int(meta["settings"]["max_seq_length"])
    bar = progress_bar(3, "pack index", "step", progress)
    try:
        import datasets

        try:
            dataset = datasets.load_from_disk(str(data_dir))
        except Exception as err:  # datasets raises many types for broken directories
            raise PackIndexError(
                f"the Arrow shards in {data_dir} cannot be loaded ({type(err).__name__}); "
                "re-run omnibert-prepare into it."
            ) from err
        lengths, masks = row_lengths(dataset)
        _check_lengths(data_dir, meta, lengths, masks)
        if lengths.size == 0:
            raise PackIndexError(f"{data_dir} holds no rows; there is nothing to pack.")
        if max_predictions_per_pack is not None and masks.max() > max_predictions_per_pack:
            raise PackIndexError(
                f"pack.max_predictions_per_pack={max_predictions_per_pack} is below the "
                f"{int(masks.max())} masked positions of a single row of {data_dir}; raise it "
                "or set it to null."
            )
        bar.update()
        try:
            assignment = pack_lengths(
                lengths, size, max_sequences_per_pack, algorithm, seed=seed, **options
            )
        except ValueError as err:  # pack.options values; the lengths were checked above
            raise PackIndexError(f"packing {data_dir} failed: {err}") from err
        assignment.check(lengths)
        dtype = np.int32 if lengths.size < 2**31 else np.int64
        packs = to_matrix(
            assignment.pack_offsets, assignment.sequence_indices, max_sequences_per_pack, dtype
        )
        split_from = packs.shape[0]
        if max_predictions_per_pack is not None:
            packs = split_over_budget(packs, masks, max_predictions_per_pack)
        bar.update()
        info: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "name": name,
            "data_fingerprint": meta.get("fingerprint"),
            "rows": int(lengths.size),
            **wanted,
            "max_sequence_length": size,
            **pack_statistics(packs, lengths, masks, size),
            "packs_added_by_mask_budget": int(packs.shape[0] - split_from),
            "runtime_s": 0.0,
            "created_by": _created_by(),
            "command": list(sys.argv),
        }
        info["runtime_s"] = round(time.perf_counter() - start, 4)
        _write_index(final, packs, info)
        bar.update()
    finally:
        bar.close()
    return PackIndex(packs=packs, info=info, path=final)


def _created_by() -> str:
    import omnibert

    return f"omnibert {omnibert.__version__}"


def _reusable(
    data_dir: Path, name: str, meta: dict[str, Any], wanted: dict[str, Any]
) -> PackIndex | None:
    """The stored index when it is valid and was built from this data with these settings."""
    try:
        info = json.loads((data_dir / PACKS_DIR / name / INFO_FILE).read_text(encoding="utf-8"))
        same = all(info.get(key) == value for key, value in wanted.items())
        if not same:
            return None
        index = load_pack_index(
            data_dir,
            name,
            rows=int(meta["counts"]["instances"]),
            fingerprint=str(meta.get("fingerprint")),
            max_sequence_length=int(meta["settings"]["max_seq_length"]),
            max_sequences_per_pack=int(wanted["max_sequences_per_pack"]),
        )
    except (OSError, ValueError, KeyError):
        return None
    index.info["reused"] = True
    return index


def pack_statistics(
    packs: npt.NDArray[np.integer[Any]], lengths: Ints, masks: Ints, max_sequence_length: int
) -> dict[str, Any]:
    """The statistics ``packing.json`` records, computed from the packs themselves."""
    valid = packs >= 0
    safe = np.where(valid, packs, 0)
    tokens = np.where(valid, lengths[safe], 0).sum(axis=1)
    masked = np.where(valid, masks[safe], 0).sum(axis=1)
    rows, num_packs, real = int(lengths.size), int(packs.shape[0]), int(lengths.sum())
    by_size = np.bincount(valid.sum(axis=1), minlength=packs.shape[1] + 1)
    return {
        "max_predictions_per_pack": int(masked.max(initial=0)),
        "max_tokens_per_pack": int(tokens.max(initial=0)),
        "num_packs": num_packs,
        "sequences_per_pack": rows / num_packs,
        "efficiency": real / (num_packs * max_sequence_length),
        "efficiency_unpacked": real / (rows * max_sequence_length),
        "speedup": rows / num_packs,
        "packs_by_size": {str(k): int(c) for k, c in enumerate(by_size) if k and c},
    }
