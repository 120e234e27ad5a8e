"""``omnibert-prepare``'s work: validate, process input files in parallel, write shards.

Every input file is one job (read → tokenize → instances → Arrow part), run by a pool of
``num_workers`` spawned processes, so memory is bounded by the files in flight, not by
the corpus.  Each file's instances equal the reference run on that file alone with the
same seed (as MLPerf runs it on each of its part files).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from omnibert.data import schema
from omnibert.prepare import shards
from omnibert.prepare.instances import (
    InputFileError,
    InstanceSettings,
    TokenizedDocuments,
    create_instances,
    read_lines,
    tokenize_documents,
)
from omnibert.prepare.metadata import (
    PartStats,
    PrepareSummary,
    RowStats,
    RunOptions,
    build_metadata,
    eval_shortfall,
    fingerprint,
    identity_of,
    skip_reason,
)
from omnibert.prepare.output_dir import PrepareError, check_output_dir, damaged_files
from omnibert.tokenization.bert_tokenizer import BertTokenizer
from omnibert.tokenization.vocab import Vocab, sha256_file

__all__ = ["PrepareError", "PrepareJob", "expand_input_files", "prepare", "process_file"]

log = logging.getLogger("omnibert.prepare")


@dataclass(frozen=True)
class PrepareJob:
    """Everything a worker needs to turn one input file into one part."""

    index: int
    input_file: str
    sha256: str
    vocab_file: str
    do_lower_case: bool
    settings: InstanceSettings
    output_dir: str
    fingerprint: str
    max_shard_size: str | int
    input_format: str = "text"


def process_file(job: PrepareJob) -> PartStats:
    """Worker: one input file → one finished part (skipped if it is already finished)."""
    output_dir = Path(job.output_dir)
    record = shards.read_part_record(output_dir, job.index)
    if record is not None and record.get("fingerprint") == job.fingerprint:
        record.pop("fingerprint")
        return PartStats(**record, resumed=True)
    start = time.perf_counter()
    vocab = Vocab.from_file(job.vocab_file)
    tokenizer = BertTokenizer(vocab, do_lower_case=job.do_lower_case)
    path = Path(job.input_file)
    lines = input_lines(path, job.input_format)
    documents = tokenize_documents(lines, tokenizer.tokenize_lines)
    del lines
    instances = create_instances(documents, vocab, job.settings)
    feats = schema.features(vocab.size, job.settings.max_seq_length)
    table = shards.to_table(instances, feats)
    lengths = instances.lengths
    stats = PartStats(
        index=job.index,
        input_file=str(path),
        sha256=job.sha256,
        bytes=path.stat().st_size,
        documents=documents.num_documents,
        segments=documents.num_segments,
        text_tokens=documents.num_tokens,
        instances=len(instances),
        tokens=int(lengths.sum()),
        masked=int(instances.mlm_offsets[-1]),
        random_next=int(instances.next_sentence_label.sum()),
        length_histogram=np.bincount(lengths, minlength=job.settings.max_seq_length + 1).tolist(),
        seconds=0.0,
    )
    stats.seconds = time.perf_counter() - start
    shards.write_part(
        output_dir, job.index, table, feats, stats.to_record(job.fingerprint), job.max_shard_size
    )
    return stats


INPUT_FORMATS = ("text", "wikiextractor")


def input_lines(path: Path, input_format: str) -> list[str]:
    """The stripped lines of one input file in the reference's layout (blank line between
    documents), read from text or from WikiExtractor ``<doc>`` output."""
    if input_format == "text":
        return read_lines(path)
    from omnibert.prepare.wikipedia import WikiFormatError, document_sentences, iter_documents

    lines: list[str] = []
    try:
        for doc in iter_documents(path):
            sentences = document_sentences(doc)
            if sentences:
                lines.extend(sentences)
                lines.append("")
    except WikiFormatError as err:
        raise InputFileError(str(err)) from err
    return lines


def expand_input_files(input_files: str | Sequence[str]) -> list[Path]:
    """Comma-separated glob patterns (the reference's ``--input_file``) or a list of them."""
    patterns = input_files.split(",") if isinstance(input_files, str) else list(input_files)
    paths: list[Path] = []
    for pattern in (p.strip() for p in patterns):
        if not pattern:
            continue
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
    identity = identity_of(settings, options, vocab, paths, hashes)
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
    results = _run_jobs(jobs, num_workers, progress)
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
    shards.clear_data_files(output_dir)  # left by an interrupted assembly: redone from parts
    records = shards.assemble(output_dir, kept_parts, keep_rows=eval_samples)
    dataset = shards.write_state(output_dir, records, dataset_fingerprint)
    if eval_samples is None:
        kept = RowStats.from_parts(parts, settings.max_seq_length)
    else:
        kept = RowStats.from_dataset(dataset, settings.max_seq_length)
    notes = [*shortfalls, *eval_shortfall(eval_samples, kept.rows)]
    metadata = build_metadata(
        parts, settings, vocab, options, dataset_fingerprint, kept, records, identity, notes
    )
    shards.complete(output_dir, metadata)
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
    results = _run_jobs([jobs[i] for i in affected], num_workers, progress)
    keep_rows = (existing.get("settings") or {}).get("eval_samples")
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


def _run_jobs(jobs: list[PrepareJob], num_workers: int, progress: bool) -> dict[int, PartStats]:
    results: dict[int, PartStats] = {}
    bar = tqdm(total=len(jobs), unit="file", desc="omnibert-prepare", disable=not progress)
    try:
        if num_workers == 1 or len(jobs) == 1:
            for job in jobs:
                results[job.index] = _run_one(job)
                _advance(bar, results)
        else:
            # Workers each run one file at a time; the Rust tokenizer's own thread pool would
            # only oversubscribe the cores the processes already use.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            with ProcessPoolExecutor(
                max_workers=min(num_workers, len(jobs)), mp_context=_worker_context()
            ) as pool:
                futures = {pool.submit(process_file, job): job for job in jobs}
                for future in as_completed(futures):
                    job = futures[future]
                    try:
                        results[job.index] = future.result()
                    except InputFileError as err:
                        for other in futures:
                            other.cancel()
                        raise PrepareError(str(err)) from err
                    _advance(bar, results)
    finally:
        bar.close()
    return results


def _worker_context() -> Any:
    """``fork`` where it is safe and cheap (Linux): workers inherit the imported modules and
    the loaded compiled kernel instead of re-importing them (about 1.5 s per worker).  The
    parent never runs the Rust tokenizer, so no thread pool is forked.  Elsewhere ``spawn``."""
    if sys.platform.startswith("linux"):
        warm_up()
        return get_context("fork")
    return get_context("spawn")


def warm_up() -> None:
    """Load the compiled instance kernel (from numba's cache) in this process."""
    empty = TokenizedDocuments(
        tokens=np.zeros(2, dtype=np.int32),
        seg_offsets=np.array([0, 1, 2], dtype=np.int64),
        doc_offsets=np.array([0, 2], dtype=np.int64),
    )
    vocab_like = _WarmVocab()
    create_instances(empty, vocab_like, InstanceSettings(dupe_factor=1))  # type: ignore[arg-type]


class _WarmVocab:
    word_ids = np.arange(8, dtype=np.int64)
    is_subword = np.zeros(8, dtype=bool)
    cls_id, sep_id, mask_id = 2, 3, 4


def _run_one(job: PrepareJob) -> PartStats:
    try:
        return process_file(job)
    except InputFileError as err:
        raise PrepareError(str(err)) from err


def _advance(bar: tqdm, results: dict[int, PartStats]) -> None:
    bar.update(1)
    bar.set_postfix(
        instances=f"{sum(p.instances for p in results.values()):,}",
        tokens=f"{sum(p.tokens for p in results.values()):,}",
    )
