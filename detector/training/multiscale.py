"""Multi-scale training with a small, known set of input shapes.

Every new input shape costs a GPU run dearly: with ``cudnn.benchmark`` cuDNN times its algorithms for
every convolution, forward and backward, the first time a (batch, size) shape appears (issue 16: epochs of
5-27 s instead of ~1 s on an H100 whenever one did). So a run draws its sizes from a short fixed list
(the multiples of 32 in ``[low, high] * image_size``), holds each size for ``hold`` steps (YOLOX-style),
pads the last batch to full size (one batch size), and stops multi-scale for the last ``fixed_last_epochs``
epochs (close-mosaic), where it trains at ``image_size``. The set of shapes is then known before the run
starts: :meth:`MultiScale.input_shapes`.

The largest size sets peak memory: activations grow with pixels, so a largest side of 1.5x costs 2.25x.
The default list is centred on ``image_size`` and stops at 1.125x, so peak activations are ~1.27x those of
fixed-size training.

Sizes depend on (seed, epoch) alone: every torchrun rank draws the same sizes without communicating, and
a resumed run replays them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def images_per_step(samples: int, batch: int) -> int:
    """The batch dimension of every training step on a rank that draws ``samples`` (:func:`samples_per_rank`)."""
    return min(batch, samples)


@dataclass(frozen=True)
class MultiScale:
    """Per-step square input size: one of :meth:`ladder`, drawn per block of ``hold`` steps.

    ``epochs`` and ``fixed_last_epochs`` (the run's length and its close-mosaic epochs) say when the size
    stops changing: from epoch ``epochs - fixed_last_epochs`` on, every step runs at ``image_size``.
    """

    image_size: int
    low: float = 0.875
    high: float = 1.125
    hold: int = 10
    epochs: int = 1
    fixed_last_epochs: int = 0
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.hold < 1:
            raise ValueError(f"--multi-scale-hold must be at least 1 step (got {self.hold})")

    def ladder(self) -> list[int]:
        """Every size a step can take, smallest first (``image_size`` alone when multi-scale is off)."""
        if not self.enabled:
            return [self.image_size]
        smallest = max(32, math.ceil(self.image_size * self.low / 32) * 32)
        largest = max(smallest, math.floor(self.image_size * self.high / 32) * 32)
        return list(range(smallest, largest + 1, 32))

    def largest(self) -> int:
        """The largest size any step takes: the ladder's top, or ``image_size`` (the close-mosaic epochs') if larger."""
        return max(self.ladder()[-1], self.image_size)

    def varies_in(self, epoch: int) -> bool:
        """Whether ``epoch`` (0-based) draws sizes; False during the final fixed-size epochs."""
        return self.enabled and epoch < self.epochs - self.fixed_last_epochs

    def sizes(self, count: int, *, seed: int, epoch: int) -> list[int]:
        """The size of each of an epoch's ``count`` steps: one draw per block of ``hold`` steps.

        Drawn from (seed, epoch) alone, so all ranks agree without talking and resume replays them.
        """
        if not self.varies_in(epoch):
            return [self.image_size] * count
        ladder = self.ladder()
        blocks = math.ceil(count / self.hold)
        generator = torch.Generator().manual_seed(seed * 7919 + epoch)
        draws = torch.randint(0, len(ladder), (blocks,), generator=generator).tolist()
        return [ladder[draws[step // self.hold]] for step in range(count)]

    def input_shapes(
        self, *, steps_per_epoch: int, batch: int, seed: int, start_epoch: int = 0
    ) -> list[tuple[int, int]]:
        """The distinct ``(batch, size)`` training inputs of epochs ``start_epoch..epochs-1``, sorted.

        ``batch`` is the images per step on one rank (:func:`images_per_step`). Replays the draws, so it is
        exact, not a bound; it costs one small ``randint`` per epoch.
        """
        seen: set[int] = set()
        for epoch in range(start_epoch, self.epochs):
            seen.update(self.sizes(steps_per_epoch, seed=seed, epoch=epoch))
        return [(batch, size) for size in sorted(seen)]

    def describe(self, shapes: int) -> str:
        """One line for the run's header: the scheme and the number of distinct training input shapes."""
        count = f"{shapes} input shape{'' if shapes == 1 else 's'}"
        if not self.enabled:
            return f"multi-scale off: {count}"
        ladder = self.ladder()
        if self.fixed_last_epochs >= self.epochs:  # a short run: every epoch is a close-mosaic epoch
            every = "its 1 epoch is a close-mosaic epoch" if self.epochs == 1 else (
                f"all {self.epochs} epochs are close-mosaic epochs")
            return (f"no mosaic or multi-scale: {every}, at {self.image_size} px (--close-mosaic "
                    f"{self.fixed_last_epochs}; 0 keeps both on): {count}")
        end = (f"; no mosaic and {self.image_size} px for the last {self.fixed_last_epochs} epochs"
               if self.fixed_last_epochs > 0 else "")
        if len(ladder) == 1:  # --imgsz too small for the factors to reach another multiple of the stride
            return f"multi-scale {ladder[0]} px only (no other multiple of 32 in range{end}): {count}"
        sizes = f"{ladder[0]}-{ladder[-1]} px ({len(ladder)} sizes, each held {self.hold} steps{end})"
        return f"multi-scale {sizes}: {count}"
