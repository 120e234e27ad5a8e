"""Loaders over omnibert's batch samplers, and where their position is saved.

Lightning saves the training loader's ``state_dict()`` in checkpoints and hands it back to
``load_state_dict()`` on resume (any loader with both methods). The training loader is
torchdata's ``StatefulDataLoader`` in the main environment. The Graphcore environment has
no torchdata: poptorch pins torch 2.0.1, and torchdata 0.11 (the release with
``StatefulDataLoader`` that omnibert uses) is built and tested for torch 2.6 although its
metadata accepts any torch 2. Its Lightning, 2.3, also creates an iterator and drops it when
it resumes at the end of an epoch; with loader workers, ``StatefulDataLoader`` then loses the
epoch its workers had prefetched (seen under torch 2.0.1 / Lightning 2.3.3: the resumed
run trained the next data epoch's batches instead). So :func:`build_loader` uses
:class:`SamplerStateDataLoader` where torchdata is missing or Lightning is older than 2.5,
a plain ``DataLoader`` that keeps the position the same way: the batch sampler
(omnibert's samplers are stateful) is asked for its state each time a batch of indices is
drawn, and ``state_dict()`` returns the state drawn with the last batch *handed out*, so
batches that loader workers fetched ahead of the training loop are not counted as seen.
A run resumed from a checkpoint sees exactly the batches the interrupted run had not yet
trained on (tests/unit/test_loaders.py, and the resume tests with the fallback forced).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from omnibert.compat import lightning_resumes_after_batch_end
from omnibert.data.loader_workers import init_worker
from omnibert.data.samplers import EvalBatchSampler

__all__ = ["SamplerStateDataLoader", "build_loader", "stateful_dataloader_class"]


def stateful_dataloader_class() -> type[DataLoader[Any]] | None:
    """torchdata's ``StatefulDataLoader`` where it imports, else ``None``."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return None
    return StatefulDataLoader


class _RecordingSampler:
    """Iterates the batch sampler, recording its state after each batch it yields."""

    def __init__(self, sampler: Any, log: deque[dict[str, Any]]) -> None:
        self.sampler = sampler
        self.log = log

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.sampler:
            self.log.append(self.sampler.state_dict())
            yield batch


class SamplerStateDataLoader(DataLoader[Any]):
    """A ``DataLoader`` over a stateful ``batch_sampler`` (``state_dict`` /
    ``load_state_dict``) that saves and restores the position of the batches it handed out
    (module docstring). Batches come back in the order their indices were drawn (a plain
    ``DataLoader`` keeps that order with any number of workers), so the k-th batch handed
    out carries the k-th recorded state."""

    def __init__(self, dataset: Dataset[Any], *, batch_sampler: Any, **kwargs: Any) -> None:
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self._sampler: Any = batch_sampler  # omnibert's: state_dict / load_state_dict
        self._drawn: deque[dict[str, Any]] = deque()
        self._recording = _RecordingSampler(batch_sampler, self._drawn)
        self._state: dict[str, Any] | None = None

    @property
    def _index_sampler(self) -> Any:  # where DataLoader's iterators draw their indices
        return self._recording

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator
        if self._state is None:  # nothing handed out or loaded yet: where the sampler is
            self._state = self._sampler.state_dict()
        elif self._drawn:
            # The last iterator was dropped with batches its workers had drawn but that were
            # never handed out (Lightning does so when it resumes at the end of an epoch):
            # they are not coming, so the sampler goes back to the last batch handed out.
            # Otherwise a whole prefetched epoch would look finished and be skipped.
            self._sampler.load_state_dict(self._state)
        self._drawn.clear()
        return self._handed_out(super().__iter__())

    def _handed_out(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            self._state = self._drawn.popleft()
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """``{"_index_sampler_state": <the batch sampler's state after the last batch handed
        out>}`` (the key torchdata's ``StatefulDataLoader`` uses for the same thing)."""
        state = self._state if self._state is not None else self._sampler.state_dict()
        return {"_index_sampler_state": dict(state)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state of this loader or of a ``StatefulDataLoader`` over the same
        sampler (with or without workers)."""
        main = state_dict.get("_snapshot", {}).get("_main_snapshot", state_dict)
        sampler_state = main.get("_index_sampler_state")
        if sampler_state is None:
            from omnibert.data.samplers import SamplerStateError

            raise SamplerStateError(
                "the checkpoint's data loader state holds no batch sampler position (keys "
                f"{sorted(state_dict)}), so it was not written by omnibert's training loader; "
                "resume from a checkpoint omnibert-train wrote, or start a fresh run."
            )
        self._sampler.load_state_dict(sampler_state)
        self._state = dict(sampler_state)
        self._drawn.clear()


def build_loader(
    dataset: Dataset[Any],
    collator: Any,
    sampler: Any,
    *,
    num_workers: int,
    seed: int,
    pin_memory: bool = False,
) -> DataLoader[Any]:
    """A loader over ``sampler``'s batches. The resumable training sampler gets a loader
    whose position Lightning saves in checkpoints: torchdata's ``StatefulDataLoader``, or
    :class:`SamplerStateDataLoader` where torchdata is missing or Lightning is older than 2.5
    (the IPU environment; module docstring); the evaluation sampler a plain ``DataLoader``. Its own seeded generator leaves torch's global
    RNG untouched. Worker processes ignore SIGTERM and SIGINT (:mod:`omnibert.stopping`): a
    signal to the process group stops the run at its next step, not with a worker's
    traceback; one that dies is named in one sentence (:mod:`omnibert.data.loader_workers`)."""
    kwargs: dict[str, Any] = {
        "batch_sampler": sampler,
        "collate_fn": collator,
        "num_workers": num_workers,
        "pin_memory": pin_memory,
        "persistent_workers": num_workers > 0,
        "generator": torch.Generator().manual_seed(seed),
    }
    evaluation = isinstance(sampler, EvalBatchSampler)
    if num_workers > 0:
        kwargs["worker_init_fn"] = init_worker("evaluation" if evaluation else "training")
    if evaluation:
        return DataLoader(dataset, **kwargs)
    stateful = stateful_dataloader_class()
    if stateful is not None and lightning_resumes_after_batch_end():
        return stateful(dataset, **kwargs)
    return SamplerStateDataLoader(dataset, **kwargs)
