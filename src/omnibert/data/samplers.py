"""Batch samplers whose position can be saved and restored exactly.

:class:`ResumableBatchSampler` is the training sampler: a fresh permutation per epoch drawn
from ``numpy.random.default_rng([seed, epoch])`` (identical on every rank and every run),
cut into equal disjoint per-rank shares, then into batches. Its ``state_dict`` is
``(epoch, batches yielded in that epoch)``; the counter is advanced *before* a batch is
handed out, so a state taken at any moment says exactly which batch comes next, including
inside a ``StatefulDataLoader`` whose worker processes are fed ahead of consumption (the
loader snapshots the sampler state for each batch it dispatches). After the last batch of
an epoch the next iteration starts epoch + 1 by itself; ``set_epoch`` jumps to an epoch.

:class:`TorchOrderBatchSampler` is fine-tuning's: the same position, state and resume, over
the order torch's own samplers give a plain ``DataLoader`` (``RandomSampler`` on one process,
``DistributedSampler`` on several), short last batch kept.

:class:`EvalBatchSampler` walks a rank's contiguous share of the eval set in order; every
rank runs the same number of batches (a rank with fewer rows gets short or empty batches,
which the evaluation collator pads with zero-weight rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from omnibert.errors import UserError

__all__ = [
    "EvalBatchSampler",
    "ResumableBatchSampler",
    "SamplerStateError",
    "TorchOrderBatchSampler",
]


class SamplerStateError(UserError):
    """A saved sampler state does not belong to this sampler's configuration."""


def check_saved_state(
    owner: object, state: dict[str, Any], keys: tuple[str, ...], sampler: str, same: str
) -> None:
    """Raise :class:`SamplerStateError` when a saved sampler ``state`` disagrees with
    ``owner`` on any of ``keys`` (then its position means nothing for this run)."""
    mismatched = [
        f"{key}={state.get(key)!r} (now {getattr(owner, key)!r})"
        for key in keys
        if state.get(key) != getattr(owner, key)
    ]
    if mismatched:
        raise SamplerStateError(
            f"the checkpoint's {sampler} was saved with "
            + ", ".join(mismatched)
            + f", so its position means nothing here; resume with the same {same}, or start "
            "a fresh run."
        )


def _check_rank(num_replicas: int, rank: int) -> None:
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise ValueError(f"rank={rank} must be in [0, num_replicas={num_replicas}).")


class ResumableBatchSampler:
    """Yields lists of dataset indices for one rank; exactly resumable (see module doc).

    Each epoch every rank takes ``num_samples // num_replicas`` indices (rank r takes every
    ``num_replicas``-th index of the permutation starting at r; the remainder is dropped so
    all ranks run the same number of steps and no index repeats within an epoch). With
    ``drop_last`` a short final batch is dropped, otherwise it is yielded short.
    ``batches_per_epoch`` caps an epoch (the rest of that epoch's permutation is skipped), so
    that an epoch can be made to end exactly where the training loop's epoch ends.
    A saved state fits every rank (Lightning restores rank 0's loader state on all ranks):
    epoch and position are the same everywhere, and the rank is not taken from it.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        batches_per_epoch: int | None = None,
    ) -> None:
        if num_samples < 0 or batch_size < 1:
            raise ValueError(
                f"num_samples={num_samples} must be >= 0 and batch_size={batch_size} >= 1."
            )
        if batches_per_epoch is not None and batches_per_epoch < 1:
            raise ValueError(f"batches_per_epoch={batches_per_epoch} must be >= 1 or None.")
        _check_rank(num_replicas, rank)
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.batches_per_epoch = batches_per_epoch
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._position = 0  # batches of `epoch` already handed out
        # where the next iterator begins: (epoch, batch); see __iter__
        self._start = (0, 0)

    @property
    def samples_per_rank(self) -> int:
        return self.num_samples // self.num_replicas

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        per_rank = self.samples_per_rank
        batches = (
            per_rank if self.drop_last else per_rank + self.batch_size - 1
        ) // self.batch_size
        return batches if self.batches_per_epoch is None else min(batches, self.batches_per_epoch)

    def set_epoch(self, epoch: int) -> None:
        """Continue from the start of ``epoch`` (no-op when already inside that epoch, so a
        resumed mid-epoch position is kept)."""
        if epoch < 0:
            raise ValueError(f"epoch={epoch} must be >= 0.")
        if epoch != self._start[0]:
            self._start = (epoch, 0)
            self.epoch, self._position = epoch, 0

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """This rank's indices for ``epoch`` in order (before cutting into batches)."""
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
        else:
            order = np.arange(self.num_samples)
        usable = self.samples_per_rank * self.num_replicas
        return order[:usable][self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        # Lazy generator: creating an iterator changes nothing until the first batch is drawn.
        # Every iterator begins at `_start`, not at the live position: a loader may create an
        # iterator, let its workers prefetch a few batches and drop it (Lightning does so when
        # it resumes at the end of an epoch), and the next iterator must not skip those
        # batches. `_start` moves on only when the iterator begun there handed out its whole
        # epoch (or a loaded state says the epoch was finished).
        epoch, position = self._start
        if self.epoch == epoch and self._position >= len(self):
            epoch, position = epoch + 1, 0
        self._start = (epoch, position)
        self.epoch, self._position = epoch, position
        indices, size = self.epoch_indices(epoch), self.batch_size
        for b in range(position, len(self)):
            # before the yield: a state taken now points past this batch
            self.epoch, self._position = epoch, b + 1
            yield indices[b * size : (b + 1) * size].tolist()

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self._position,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "batches_per_epoch": self.batches_per_epoch,
        }

    #: the keys a resumed run must keep, in the sentence that refuses another value
    same_keys = (
        "data, micro_batch_size (derived from phase.global_batch_size when null), "
        "accelerator.devices and seed"
    )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        keys = ("num_samples", "batch_size", "num_replicas", "seed", "shuffle", "drop_last")
        check_saved_state(self, state, keys, "data sampler", self.same_keys)
        self.epoch = int(state["epoch"])
        self._position = int(state["position"])
        self._start = (self.epoch, self._position)


class TorchOrderBatchSampler(ResumableBatchSampler):
    """Fine-tuning's training batches, in the order a plain ``DataLoader`` over torch's own
    samplers gives them (what fine-tuning used before its position was saved), resumable as
    :class:`ResumableBatchSampler` is (same state, same iterator rules); the short last
    batch of a rank's share is kept.

    * One process: the permutations of ``RandomSampler`` with one generator seeded with
      ``seed``. It draws a permutation when a pass starts and another, unused, when the pass
      runs out (``randperm(n)[:0]``), so epoch ``e`` is the permutation drawn after ``2e``.
    * Several: ``DistributedSampler(shuffle=True, drop_last=False)``: epoch ``e`` is
      ``randperm(n)`` of a generator seeded with ``seed + e``, padded with its own start to a
      multiple of ``num_replicas``; rank ``r`` takes every ``num_replicas``-th index from ``r``
      (``ceil(n / num_replicas)`` each).
    """

    same_keys = (
        "data, micro_batch_size (task.batch_size / devices when null), accelerator.devices and seed"
    )

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        seed: int,
        num_replicas: int = 1,
        rank: int = 0,
        batches_per_epoch: int | None = None,
    ) -> None:
        super().__init__(
            num_samples, batch_size, shuffle=True, seed=seed, drop_last=False,
            num_replicas=num_replicas, rank=rank, batches_per_epoch=batches_per_epoch,
        )  # fmt: skip
        # one process: (epoch, the generator's state at that epoch's permutation), so that
        # the next epoch draws on from there instead of from the seed
        self._stream: tuple[int, torch.Tensor] | None = None

    @property
    def samples_per_rank(self) -> int:
        return -(-self.num_samples // self.num_replicas)

    def epoch_indices(self, epoch: int) -> np.ndarray:
        n = self.num_samples
        if self.num_replicas == 1:
            return self._single_process_order(epoch)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + epoch))
        total = self.samples_per_rank * self.num_replicas
        if n:  # padded with its own start (repeated while shorter than the padding)
            order = order.repeat(-(-total // n))[:total]
        return order[self.rank :: self.num_replicas].numpy()

    def _single_process_order(self, epoch: int) -> np.ndarray:
        generator = torch.Generator()
        reached = 0
        if self._stream is not None and self._stream[0] <= epoch:
            reached = self._stream[0]
            generator.set_state(self._stream[1])
        else:
            generator.manual_seed(self.seed)
        for _ in range(2 * (epoch - reached)):  # each earlier pass: its own and the unused one
            torch.randperm(self.num_samples, generator=generator)
        self._stream = (epoch, generator.get_state())
        return torch.randperm(self.num_samples, generator=generator).numpy()


class EvalBatchSampler:
    """In-order batches over rank ``rank``'s contiguous share of ``range(num_samples)``.

    Shares differ by at most one row; every rank yields ``len(self)`` batches (the largest
    share's count), so ranks stay in step and every row is evaluated exactly once.
    """

    def __init__(
        self, num_samples: int, batch_size: int, *, num_replicas: int = 1, rank: int = 0
    ) -> None:
        if num_samples < 0 or batch_size < 1:
            raise ValueError(
                f"num_samples={num_samples} must be >= 0 and batch_size={batch_size} >= 1."
            )
        _check_rank(num_replicas, rank)
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.num_replicas = num_replicas
        self.rank = rank

    def bounds(self) -> tuple[int, int]:
        """``[start, stop)`` of this rank's share."""
        base, extra = divmod(self.num_samples, self.num_replicas)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)

    def __len__(self) -> int:
        largest = -(-self.num_samples // self.num_replicas)
        return -(-largest // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        start, stop = self.bounds()
        for b in range(len(self)):
            lo = min(start + b * self.batch_size, stop)
            yield list(range(lo, min(lo + self.batch_size, stop)))
