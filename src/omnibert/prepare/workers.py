"""``omnibert-prepare``'s workers: one input file → one finished part per job
(:func:`process_file`), run in this process or by a pool of worker processes that never
outlive the run (:func:`run_jobs`).

A ``ProcessPoolExecutor`` worker whose parent is gone waits forever: it blocks reading the
next job from the call-queue pipe, whose write end it holds itself (inherited at fork;
spawn pickles both ends of the queue too), so it never sees end-of-file, and a result it
sends can block on the result pipe nobody reads. So each worker asks the kernel to kill it
when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere a thread watches the
parent id) and checks that the parent is still there once that is set up.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from omnibert.data import schema
from omnibert.logs import progress_bar
from omnibert.prepare import shards
from omnibert.prepare.instances import (
    InputFileError,
    InstanceSettings,
    TokenizedDocuments,
    create_instances,
    read_lines,
    tokenize_documents,
)
from omnibert.prepare.metadata import PartStats
from omnibert.prepare.output_dir import PrepareError
from omnibert.stopping import Stopped
from omnibert.tokenization.bert_tokenizer import BertTokenizer
from omnibert.tokenization.vocab import Vocab

__all__ = ["INPUT_FORMATS", "PrepareJob", "die_with_parent", "process_file", "run_jobs"]

INPUT_FORMATS = ("text", "wikiextractor")


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


def run_jobs(jobs: list[PrepareJob], num_workers: int, progress: bool) -> dict[int, PartStats]:
    """Run ``jobs`` (here, or in up to ``num_workers`` worker processes) with a progress bar;
    an input file error or a worker killed from outside stops the run with one sentence,
    every part finished so far kept for the next run to resume. SIGTERM / SIGINT
    (:mod:`omnibert.stopping`) end the workers at once (a part is written whole or not at
    all) and stop with the count of finished files."""
    results: dict[int, PartStats] = {}
    bar = progress_bar(len(jobs), "omnibert-prepare", "file", progress)  # lines in a log file
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
                max_workers=min(num_workers, len(jobs)),
                mp_context=_worker_context(),
                initializer=die_with_parent,
                initargs=(os.getpid(),),
            ) as pool:
                futures = {pool.submit(process_file, job): job for job in jobs}
                try:
                    for future in as_completed(futures):
                        results[futures[future].index] = future.result()
                        _advance(bar, results)
                except (InputFileError, BrokenProcessPool) as err:
                    for other in futures:
                        other.cancel()
                    raise PrepareError(_failure(err, futures, results)) from err
                except Stopped:
                    _end_workers(pool, Path(jobs[0].output_dir))
                    raise
    except Stopped as stop:
        done = sum(
            1
            for job in jobs
            if (shards.part_dir(Path(job.output_dir), job.index) / shards.PART_FILE).is_file()
        )  # finished parts on disk (a result still on its way from a worker counts)
        stop.where = f" with {done} of {len(jobs)} input files done"
        stop.hint = "the finished ones are kept; run the same command again to go on"
        raise
    finally:
        bar.close()
    return results


def _end_workers(pool: ProcessPoolExecutor, output_dir: Path) -> None:
    """Kill the pool's workers now (a signal sent to the run alone does not reach them)
    instead of waiting for their files, and remove the part each was writing (a part is renamed into place whole,
    so a finished one is never touched)."""
    processes = dict(getattr(pool, "_processes", None) or {})  # terminate_workers() from 3.14
    for process in processes.values():
        process.kill()
    pool.shutdown(wait=True, cancel_futures=True)
    parts = output_dir / shards.PARTS_DIR
    for pid in processes:
        for unfinished in parts.glob(f"part-*.tmp-{pid}"):
            shutil.rmtree(unfinished, ignore_errors=True)


def _failure(err: Exception, futures: dict[Any, PrepareJob], results: dict[int, Any]) -> str:
    if isinstance(err, InputFileError):
        return str(err)
    running = [job.input_file for job in futures.values() if job.index not in results]
    return (
        f"a worker process died while working on {', '.join(running[:3])}"
        f"{', ...' if len(running) > 3 else ''} (killed from outside, often by the "
        "out-of-memory killer); lower num_workers and re-run: the finished files are kept."
    )


#: Linux ``prctl`` option: the signal this process gets when its parent thread exits
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Worker initializer: end this process as soon as ``parent_pid`` (the run) is gone.

    SIGINT is ignored (a Ctrl-C to the process group would print a ``KeyboardInterrupt``
    traceback per worker; the run stops and ends its workers). SIGTERM gets its default
    back: the pool itself ends workers with SIGTERM when it breaks (a worker killed from
    outside), and a worker killed by it prints nothing, while the run stops on the same
    signal (:mod:`omnibert.stopping`). A forked worker would otherwise keep the run's Python
    handler, which ignores the signal in any other process, and the broken pool would wait
    for it to finish its whole file."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # last: a test waits for it
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            _watch_parent(parent_pid)  # pragma: no cover - prctl refused (seccomp)
    else:  # pragma: no cover - Linux only in CI
        _watch_parent(parent_pid)
    if os.getppid() != parent_pid:  # the parent died before the kernel was asked
        os._exit(1)


def _watch_parent(parent_pid: int, interval: float = 1.0) -> None:
    """Portable fallback: a daemon thread that ends the process once it is re-parented."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="omnibert-parent-watch", daemon=True).start()


def _worker_context() -> Any:
    """``fork`` where it is safe and cheap (Linux): workers inherit the imported modules and
    the loaded compiled kernel instead of importing and loading them again in each worker.  The
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


def _advance(bar: Any, results: dict[int, PartStats]) -> None:
    bar.update(1)
    bar.set_postfix(
        instances=f"{sum(p.instances for p in results.values()):,}",
        tokens=f"{sum(p.tokens for p in results.values()):,}",
    )
