"""Training samplers: a seeded shuffle per epoch, sharded across processes, carrying augmentation state.

They yield ``(index, epoch, use_mosaic)`` keys, so the dataset's augmentation depends only on those
(persistent workers never hold stale state when mosaic closes), and every rank sees its own shard. Given
the batch size, every rank's shard is whole batches (:func:`samples_per_rank`). :class:`EpochSampler` shuffles
images; :class:`RectBatchSampler` (``--rect``) yields whole batches of images that share a canvas.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

Key = tuple[int, int, bool]  # (index, epoch, use_mosaic); an index past the dataset's size is a repeat of it


def samples_per_rank(dataset_size: int, world_size: int, batch: int) -> int:
    """Samples each rank draws per epoch: its share of the dataset, rounded up to whole batches.

    A partial last batch would add a new input shape (and a noisy small-batch step), and dropping it would
    skip a few images every epoch (6% of BCCD's 205 at batch 16: mAP50-95 0.529/0.519 dropped against
    0.534/0.535 padded, docs/multiscale.md, "Accuracy"). So the sampler fills the last batch by wrapping
    round to the start of the epoch's shuffled order. A share smaller than one batch stays as it is: one
    partial batch.
    """
    share = math.ceil(dataset_size / world_size)
    return math.ceil(share / batch) * batch if share >= batch else share


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator an epoch's order is drawn from: (seed, epoch) alone, so every rank draws the same order without
    talking and a resumed run replays it."""
    return torch.Generator().manual_seed(seed * 100_003 + epoch)


class EpochSampler(Sampler[Key]):
    def __init__(
        self, size: int, *, seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = True, batch: int = 1
    ) -> None:
        self.size, self.seed, self.rank, self.world_size, self.shuffle = size, seed, rank, world_size, shuffle
        self.epoch = 0
        self.use_mosaic = True
        self.per_rank = samples_per_rank(size, world_size, batch)

    def set_epoch(self, epoch: int, *, use_mosaic: bool) -> None:
        self.epoch, self.use_mosaic = epoch, use_mosaic

    def __len__(self) -> int:
        return self.per_rank

    def __iter__(self) -> Iterator[Key]:
        # The keys of the epoch this pass began for: a set_epoch while it is under way (the trainer begins the
        # next epoch's pass only after this one ends; detector/training/feed.py) never reaches its later keys.
        epoch, use_mosaic = self.epoch, self.use_mosaic
        if self.shuffle:
            order = torch.randperm(self.size, generator=epoch_generator(self.seed, epoch)).tolist()
        else:
            order = list(range(self.size))
        # Pad by wrapping round the epoch's order, so every rank gets as many, in whole batches. A repeat's key is
        # its index plus the dataset's size per wrap: the dataset reads the same image (index modulo its size) with
        # draws of its own, where the same key gave the very same augmented item twice in the epoch.
        total = self.per_rank * self.world_size
        size = max(len(order), 1)
        order = [index + size * (position // size) for position, index in
                 enumerate((order * math.ceil(total / size))[:total])]
        for index in order[self.rank :: self.world_size]:
            yield index, epoch, use_mosaic


class RectBatchSampler(Sampler[list[Key]]):
    """``--rect`` training: whole batches of images that share a canvas, each batch a list of keys (a DataLoader's
    ``batch_sampler``; ``len`` is the steps a rank takes per epoch).

    The batches are the images cut in aspect-ratio order (:func:`detector.data.letterbox.rect_batches`, which gives
    each image its batch's canvas), as Ultralytics' rect=True cuts them. Per (seed, epoch), two things it does not:

    - the order of the batches is shuffled. Ultralytics turns the loader's shuffle off under rect=True, so every epoch
      ran one fixed sequence, the narrowest canvas first and the tallest last.
    - the images of one canvas are dealt anew among that canvas's batches. Where every batch has the same canvas
      (BCCD's 640x480 images) that is a plain shuffle, which Ultralytics keeps in that case too; an image never moves
      to another canvas, so its own geometry is the same every epoch.

    A partial batch (the last of the aspect order's) is filled with repeats of its own members: it keeps its canvas,
    and every step has one batch size. Under torchrun batch ``i`` of the epoch's order goes to rank ``i %
    world_size``, the order padded with repeats of its first batches until every rank has as many (:class:`EpochSampler`
    wraps round the same way). A repeat's key is its index plus the dataset's size per earlier appearance in the
    epoch, so it gets draws of its own (as in :class:`EpochSampler`).
    """

    def __init__(self, order: Sequence[int] | np.ndarray, canvas_hw: np.ndarray, *, batch: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1) -> None:
        """``order``: every dataset index once, in aspect order; ``canvas_hw``: each index's canvas ``[N, 2]``."""
        indices = [int(index) for index in order]
        self.size, self.batch = len(indices), max(1, min(batch, len(indices)))
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch, self.use_mosaic = 0, True
        self.batches = [indices[start : start + self.batch] for start in range(0, self.size, self.batch)]
        self.canvases = [(int(canvas_hw[members[0]][0]), int(canvas_hw[members[0]][1])) for members in self.batches]
        if any(tuple(map(int, canvas_hw[index])) != canvas for members, canvas in zip(self.batches, self.canvases)
               for index in members):
            raise ValueError("every image of a rectangular batch must have the batch's canvas")
        self.per_rank = math.ceil(len(self.batches) / world_size)

    def set_epoch(self, epoch: int, *, use_mosaic: bool) -> None:
        self.epoch, self.use_mosaic = epoch, use_mosaic

    def __len__(self) -> int:
        return self.per_rank

    def input_shapes(self) -> list[tuple[int, int, int]]:
        """The distinct ``(batch, height, width)`` inputs of a step: one per canvas."""
        return [(self.batch, height, width) for height, width in sorted(set(self.canvases))]

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All ranks' batches of ``epoch``, in its order (rank ``r`` takes positions ``r, r + world_size, ...``), as
        key indices: whole, padded and with the repeat convention of the class docstring."""
        generator = epoch_generator(self.seed, epoch)
        dealt = self._dealt(generator)
        order = torch.randperm(len(dealt), generator=generator).tolist()
        total = self.per_rank * self.world_size
        seen = [0] * self.size  # appearances of each image so far in the epoch, all ranks'
        batches = []
        for position in (order * math.ceil(total / len(order)))[:total]:
            members = dealt[position]
            keys = []
            for index in (members * math.ceil(self.batch / len(members)))[: self.batch]:
                keys.append(index + self.size * seen[index])
                seen[index] += 1
            batches.append(keys)
        return batches

    def _dealt(self, generator: torch.Generator) -> list[list[int]]:
        """The batches, each canvas's images shuffled among its batches (each batch keeps its size)."""
        by_canvas: dict[tuple[int, int], list[int]] = {}
        for number, canvas in enumerate(self.canvases):
            by_canvas.setdefault(canvas, []).append(number)
        dealt: list[list[int]] = [[] for _ in self.batches]
        for numbers in by_canvas.values():
            members = [index for number in numbers for index in self.batches[number]]
            shuffled = [members[i] for i in torch.randperm(len(members), generator=generator).tolist()]
            for number in numbers:
                dealt[number], shuffled = shuffled[: len(self.batches[number])], shuffled[len(self.batches[number]) :]
        return dealt

    def __iter__(self) -> Iterator[list[Key]]:
        epoch, use_mosaic = self.epoch, self.use_mosaic  # the pass's own, as EpochSampler's
        for keys in self.epoch_batches(epoch)[self.rank :: self.world_size]:
            yield [(index, epoch, use_mosaic) for index in keys]
