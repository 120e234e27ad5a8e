"""``omnibert-prepare``'s work: validate, process input files in parallel, write shards.

Every input file is one job (read → tokenize → instances → Arrow part), run by a pool of
``num_workers`` worker processes (:mod:`omnibert.prepare.workers`; they die with the run),
so memory is bounded by the files in flight, not by the corpus.  Each file's instances equal the reference run on that file alone with the
same seed (as MLPerf runs it on each of its part files).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omnibert import stopping
from omnibert.prepare import shards
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.metadata import (
    PrepareSummary,
    RowStats,
    RunOptions,
    build_metadata,
    eval_shortfall,
    fingerprint,
    identity_of,
    row_stats,
    skip_reason,
)
from omnibert.prepare.output_dir import PrepareError, check_output_dir, damaged_files
from omnibert.prepare.workers import INPUT_FORMATS, PrepareJob, process_file, run_jobs
from omnibert.tokenization.vocab import Vocab, sha256_file

__all__ = ["PrepareError", "PrepareJob", "expand_input_files", "prepare", "process_file"]

log = logging.getLogger("omnibert.prepare")


def patterns_of(input_files: str | Sequence[str]) -> list[str]:
    """The comma-separated patterns (or the list) of ``input_files``, as given."""
    patterns = input_files.split(",") if isinstance(input_files, str) else list(input_files)
    return [p.strip() for p in patterns if p.strip()]


def expand_input_files(input_files: str | Sequence[str]) -> list[Path]:
    """Comma-separated glob patterns (the reference's ``--input_file``) or a list of them."""
    paths: list[Path] = []
    for pattern in patterns_of(input_files):
        if any(ch in pattern for ch in "*?["):
            matches = (
                sorted(Path().glob(pattern))
                if not Path(pattern).is_absolute()
                else sorted(Path("/").glob(pattern.lstrip("/")))
            )
            if not matches:
                raise PrepareError(
                    f"input_files pattern {pattern!r} matches no file; fix the path."
                )
            paths.extend(matches)
        else:
            paths.append(Path(pattern))
    if not paths:
        raise PrepareError("input_files is empty; pass input_files=[a.txt,b.txt] or a glob.")
    for path in paths:
        if not path.is_file():
            raise PrepareError(f"input file {str(path)!r} does not exist; fix input_files.")
        if not os.access(path, os.R_OK):
            raise PrepareError(f"input file {str(path)!r} is not readable; fix its permissions.")
    return paths


def prepare(
    input_files: str | Sequence[str],
    vocab_file: str | Path,
    output_dir: str | Path,
    settings: InstanceSettings,
    *,
    do_lower_case: bool = True,
    input_format: str = "text",
    num_workers: int = 1,
    eval_samples: int | None = None,
    overwrite: bool = False,
    max_shard_size: str | int = "500MB",
    progress: bool = True,
    shortfalls: Sequence[dict[str, Any]] = (),
) -> PrepareSummary:
    """Turn text files into Arrow shards of reference-exact pretraining instances.

    A finished ``output_dir`` of the same data is verified (sizes and CRC-32C of its Arrow
    files) and its damaged files are regenerated from their input files. ``shortfalls``:
    what earlier steps produced less of than asked (a trained vocab), kept in metadata.json.
    """
    start = time.perf_counter()
    try:
        settings.validate()
    except ValueError as err:
        raise PrepareError(str(err)) from err
    if input_format not in INPUT_FORMATS:
        raise PrepareError(
            f"input_format={input_format!r} is not one of {list(INPUT_FORMATS)}; fix input_format."
        )
    if num_workers < 1:
        raise PrepareError(f"num_workers={num_workers} must be at least 1.")
    if eval_samples is not None and eval_samples < 1:
        raise PrepareError(f"eval_samples={eval_samples} must be a positive count or null.")
    paths = expand_input_files(input_files)
    vocab = Vocab.from_file(vocab_file)
    output_dir = Path(output_dir)
    hashes = [sha256_file(p) for p in paths]
    dataset_fingerprint = fingerprint(
        settings, vocab, do_lower_case, hashes, input_format, eval_samples
    )
    options = RunOptions(do_lower_case, input_format, eval_samples, max_shard_size)
    identity = identity_of(settings, options, vocab, paths, hashes, patterns_of(input_files))
    existing = check_output_dir(output_dir, dataset_fingerprint, overwrite, identity)
    damaged = [] if existing is None else damaged_files(output_dir, existing)
    if existing is not None and not damaged:
        return PrepareSummary(str(output_dir), len(paths), 0, 0, 0, 0.0, already_complete=True)
    output_dir.mkdir(parents=True, exist_ok=True)

    jobs = [
        PrepareJob(
            index=i,
            input_file=str(path),
            sha256=sha,
            vocab_file=str(vocab_file),
            do_lower_case=do_lower_case,
            settings=settings,
            output_dir=str(output_dir),
            fingerprint=fingerprint(settings, vocab, do_lower_case, [sha], input_format),
            max_shard_size=max_shard_size,
            input_format=input_format,
        )
        for i, (path, sha) in enumerate(zip(paths, hashes, strict=True))
    ]
    if existing is not None:
        return _repair(existing, damaged, jobs, num_workers, progress, start)
    results = run_jobs(jobs, num_workers, progress)
    parts = [results[i] for i in range(len(jobs))]
    kept_parts = [p.index for p in parts if p.instances > 0]
    for part in parts:
        if part.instances == 0:
            log.warning("skipped input file %s: %s", part.input_file, skip_reason(part))
    if not kept_parts:
        raise PrepareError(
            f"no input file gives any instance ({', '.join(p.input_file for p in parts[:3])}"
            f"{', ...' if len(parts) > 3 else ''} hold no documents); fix input_files."
        )
    with stopping.at_safe_points(f"the end of writing {output_dir}"):  # seconds, not hours
        shards.clear_data_files(output_dir)  # left by an interrupted assembly: redone from parts
        records = shards.assemble(output_dir, kept_parts, keep_rows=eval_samples)
        dataset = shards.write_state(output_dir, records, dataset_fingerprint)
        if eval_samples is None:
            kept = row_stats(parts, settings.max_seq_length)
        else:
            kept = RowStats.from_dataset(dataset, settings.max_seq_length)
        notes = [*shortfalls, *eval_shortfall(eval_samples, kept.rows)]
        metadata = build_metadata(
            parts, settings, vocab, options, dataset_fingerprint, kept, records, identity, notes
        )
        shards.complete(output_dir, metadata)
    stopping.set_context(f" after {output_dir} was complete")
    stopping.check()
    seconds = time.perf_counter() - start
    return PrepareSummary(
        output_dir=str(output_dir),
        files=len(parts),
        documents=sum(p.documents for p in parts),
        instances=len(dataset),
        tokens=metadata["counts"]["tokens"],
        seconds=seconds,
        resumed_files=sum(p.resumed for p in parts),
        parts=parts,
        shortfalls=notes,
    )


def _repair(
    existing: dict[str, Any],
    damaged: list[tuple[Any, str]],
    jobs: list[PrepareJob],
    num_workers: int,
    progress: bool,
    start: float,
) -> PrepareSummary:
    """Regenerate the input files whose rows a damaged Arrow file held, put their files in
    place and record them; everything else in the finished directory stays as it is."""
    output_dir = Path(jobs[0].output_dir)
    affected = sorted({int(i) for record, _ in damaged for i in record["inputs"]})
    for record, what in damaged:
        inputs = ", ".join(jobs[i].input_file for i in record["inputs"])
        log.warning("%s %s; regenerating it from %s", record["filename"], what, inputs)
    results = run_jobs([jobs[i] for i in affected], num_workers, progress)
    keep_rows = (existing.get("settings") or {}).get("eval_samples")
    with stopping.at_safe_points(f"the end of writing {output_dir}"):
        records = shards.assemble(output_dir, affected, keep_rows=keep_rows)
        untouched = [r for r in existing["files"] if not set(r["inputs"]) & set(affected)]
        records = sorted([*untouched, *records], key=lambda r: str(r["filename"]))
        dataset = shards.write_state(output_dir, records, existing["fingerprint"])
        if len(dataset) != existing["counts"]["instances"]:  # pragma: no cover - nondeterminism
            raise PrepareError(
                f"regenerating {output_dir} gave {len(dataset)} rows, not the "
                f"{existing['counts']['instances']} recorded; pass overwrite=true to redo it all."
            )
        shards.complete(output_dir, {**existing, "files": records})
    stopping.set_context(f" after {output_dir} was repaired")
    stopping.check()
    return PrepareSummary(
        output_dir=str(output_dir),
        files=len(jobs),
        documents=sum(p.documents for p in results.values()),
        instances=len(dataset),
        tokens=int(existing["counts"]["tokens"]),
        seconds=time.perf_counter() - start,
        repaired=[str(record["filename"]) for record, _ in damaged],
        parts=[results[i] for i in affected],
    )
