"""``omnibert-prepare``'s work: validate, process input files in parallel, write shards.

Every input file is one job (read → tokenize → instances → Arrow part), run by a pool of
``num_workers`` spawned processes, so memory is bounded by the files in flight, not by
the corpus.  Each file's instances equal the reference run on that file alone with the
same seed (as MLPerf runs it on each of its part files).
"""

from __future__ import annotations

import json
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
from omnibert.errors import UserError
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
    build_metadata,
    fingerprint,
)
from omnibert.tokenization.bert_tokenizer import BertTokenizer
from omnibert.tokenization.vocab import Vocab, sha256_file


class PrepareError(UserError):
    """A problem with the inputs or the output directory, said in one sentence."""


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


def _check_output_dir(output_dir: Path, fingerprint: str, overwrite: bool) -> bool:
    """True when ``output_dir`` already holds exactly this data.  Raises when it holds
    something else, unless ``overwrite``."""
    if not output_dir.exists():
        return False
    if not output_dir.is_dir():
        raise PrepareError(f"output_dir {str(output_dir)!r} is a file; choose a directory.")
    meta_path = output_dir / schema.METADATA_FILE
    if meta_path.is_file():
        existing = json.loads(meta_path.read_text(encoding="utf-8")).get("fingerprint")
        if existing == fingerprint:
            return True
        if not overwrite:
            raise PrepareError(
                f"output_dir {str(output_dir)!r} already holds data prepared from other inputs "
                "or settings; choose another output_dir or pass overwrite=true to replace it."
            )
        shards.remove_outputs(output_dir)
        return False
    foreign = [p.name for p in output_dir.iterdir() if not shards.written_by_us(p)]
    if foreign and not overwrite:
        raise PrepareError(
            f"output_dir {str(output_dir)!r} is not empty and was not written by omnibert-prepare "
            f"(it holds {foreign[0]!r}); choose an empty or new directory."
        )
    if overwrite:
        shards.remove_outputs(output_dir)
    return False


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
) -> PrepareSummary:
    """Turn text files into Arrow shards of reference-exact pretraining instances."""
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
    if _check_output_dir(output_dir, dataset_fingerprint, overwrite):
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
    results = _run_jobs(jobs, num_workers, progress)
    parts = [results[i] for i in range(len(jobs))]
    dataset = shards.assemble(output_dir, len(jobs), dataset_fingerprint, keep_rows=eval_samples)
    if eval_samples is None:
        kept = RowStats.from_parts(parts, settings.max_seq_length)
    else:
        kept = RowStats.from_dataset(dataset, settings.max_seq_length)
    metadata = build_metadata(
        parts, settings, vocab, do_lower_case, dataset_fingerprint, eval_samples, kept
    )
    shards.complete(output_dir, metadata)
    rows = len(dataset)
    seconds = time.perf_counter() - start
    return PrepareSummary(
        output_dir=str(output_dir),
        files=len(parts),
        documents=sum(p.documents for p in parts),
        instances=rows,
        tokens=metadata["counts"]["tokens"],
        seconds=seconds,
        resumed_files=sum(p.resumed for p in parts),
        parts=parts,
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
