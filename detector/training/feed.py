"""The training loader, epoch by epoch: each epoch's pass over the loader begins as soon as its batches are known.

A persistent loader's workers sit idle from the end of one epoch's pass until the next ``iter()``, and then the
step waits for the new pass's first batches. With short epochs that wait is a large share of the run: BCCD on
an H100 (13 steps an epoch, 15 workers) waited for data 10-62% of every epoch (docs/gpu.md). So the trainer
begins the next epoch's pass right after an epoch's training, and the workers prepare its first batches while
the main process validates and writes the checkpoint. That is done only where nothing decided in between can
change the next epoch's batches: the sampler's keys (epoch, mosaic or not) are fixed by the plan, which only
``--time`` re-fits after an epoch. A pass begun for other keys is dropped and begun again.

Epoch 0's pass is begun before the run's first step, for the AMP check's first batch; it carries on as epoch
0 (that batch first) instead of being dropped and begun again, which threw away the batches the workers had
ready (up to ``prefetch_factor`` per worker: all 13 of a BCCD epoch at 15 workers).

On CUDA each batch's pixels also travel to the GPU one step ahead (:func:`uploaded_ahead`), on a stream of their
own, while the GPU runs the step before: on the step's stream the copy would sit between two steps' kernels.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from detector.data.device_augment import WarpBatch
from detector.data.sampler import EpochSampler, RectBatchSampler
from detector.data.workers import stop_workers


class EpochBatches:
    """One epoch's batches, from a pass that may have begun (and yielded some batches) already: ``len`` is the
    epoch's number of steps, as the loader's is."""

    def __init__(self, batches: Iterator[Any], steps: int) -> None:
        self._batches, self._steps = batches, steps

    def __len__(self) -> int:
        return self._steps

    def __iter__(self) -> Iterator[Any]:
        return self._batches


class EpochFeed:
    """The train loader's passes, one per epoch, each begun by :meth:`begin` or, at the latest, by :meth:`epoch`."""

    def __init__(self, sampler: EpochSampler | RectBatchSampler, loader: DataLoader) -> None:
        self.sampler, self.loader = sampler, loader
        self._begun: tuple[tuple[int, bool], Iterator[Any]] | None = None  # (epoch, use_mosaic), the pass

    def begin(self, epoch: int, *, use_mosaic: bool) -> Iterator[Any]:
        """Begin ``epoch``'s pass now (the workers start on its first batches); returns it, for a caller that
        draws from it before the epoch (then :meth:`put_back` what it drew, or the epoch begins anew)."""
        self.sampler.set_epoch(epoch, use_mosaic=use_mosaic)
        batches = iter(self.loader)
        self._begun = (epoch, use_mosaic), batches
        return batches

    def put_back(self, drawn: list[Any]) -> None:
        """The batches drawn from the pass :meth:`begin` returned come first in its epoch after all."""
        if self._begun is not None:
            keys, batches = self._begun
            self._begun = keys, itertools.chain(drawn, batches)

    def forget(self) -> None:
        """Batches were drawn from the begun pass and not put back: the epoch must begin anew."""
        self._begun = None

    def epoch(self, epoch: int, *, use_mosaic: bool) -> EpochBatches:
        """``epoch``'s batches: the pass begun for these keys, else one begun now."""
        begun, self._begun = self._begun, None
        if begun is not None and begun[0] == (epoch, use_mosaic):
            batches = begun[1]
        else:
            batches = self.begin(epoch, use_mosaic=use_mosaic)
            self._begun = None
        return EpochBatches(batches, len(self.loader))

    def stop(self) -> None:
        """Stop the loader's workers (a begun pass is dropped): :func:`detector.data.workers.stop_workers`."""
        self._begun = None
        stop_workers(self.loader)


def uploaded_ahead(batches: Iterable[tuple[Any, ...]], device: torch.device) -> Iterator[tuple[Any, ...]]:
    """``batches`` (images first: a uint8 tensor or a :class:`WarpBatch`) with their images on ``device``, each
    copied on a side stream while the caller still steps on the batch before; other devices: ``batches`` as is.

    A batch is handed out once its copy is queued and the step's stream waits for it, so what the caller queues
    on that stream sees the pixels. The loader is asked for the next batch one step early: what the step waits
    for the loader is unchanged, only when. The copies read the loader's pinned memory (non-blocking; a pageable
    batch is copied synchronously, as ``.to`` would).
    """
    if device.type != "cuda":
        yield from batches
        return
    side = upload_stream(device)
    pending: tuple[tuple[Any, ...], torch.cuda.Event] | None = None
    for batch in batches:
        with torch.cuda.stream(side):
            moved = (batch[0].to(device, non_blocking=True), *batch[1:])  # a tensor or a WarpBatch
        copied = side.record_event()
        if pending is not None:
            yield handed_over(*pending, device)
        pending = moved, copied
    if pending is not None:
        yield handed_over(*pending, device)


_UPLOAD_STREAMS: dict[int, torch.cuda.Stream] = {}  # GPU index -> the stream batches travel to it on


def upload_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream :func:`uploaded_ahead` copies batches to ``device`` on: one per GPU for the process.

    Not one per epoch: the caching allocator gives a freed block again only to the stream it was allocated on, so
    each epoch's new stream left the blocks of the epoch before (a mosaic batch's atlas at 640 px and batch 64 is
    ~130 MB, a few in flight) reserved and unused, and took new ones from the driver until streams repeat (torch
    hands out 32 per device in turn), where the copies could also queue behind a CUDA graph's warm-up steps.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _UPLOAD_STREAMS:
        _UPLOAD_STREAMS[index] = torch.cuda.Stream(torch.device("cuda", index))
    return _UPLOAD_STREAMS[index]


def handed_over(batch: tuple[Any, ...], copied: torch.cuda.Event, device: torch.device) -> tuple[Any, ...]:
    """``batch`` for the current stream: it waits for the copy, and the allocator keeps the copy's memory until what
    the current stream queues on it has run (it was allocated on the side stream)."""
    stream = torch.cuda.current_stream(device)
    stream.wait_event(copied)
    images = batch[0]
    for tensor in images.tensors() if isinstance(images, WarpBatch) else (images,):
        tensor.record_stream(stream)
    return batch
