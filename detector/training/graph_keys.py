"""Which captured CUDA graph each training step takes, and when a new one is captured: bookkeeping only, no CUDA.

A graph's key is ``(input shape, box slots, ends with the optimizer)`` (detector/training/cuda_graph.py). Every new
key costs the loop once: eager runs before its capture (cuDNN's autotuning and lazy state; an eager step ran at
~0.5x the graphed rate on the H100) and the capture (the host records the step's launches and instantiates the
graph). A long run pays that once per key and forgets it; a short one meets most of its keys in its first epochs.

**Box slots.** A batch's targets are padded to a fixed box count, at least the smallest power of two (16 or more)
that holds its fullest image's boxes (:func:`detector.loss.box_slots`). Which power of two varies from batch to
batch (with mosaic, the fullest of 64 images), and each was a key of its own for every input size: the 2-epoch
mosaic run of the GPU leases met 15 keys, BCCD's 100 epochs 28, in 16 epochs after its fifth
(``benchmarks/graph_keys.py``). So the book pads a batch to a larger count that its shape already has a key for,
instead of opening a new key, until the padding spent on that smaller count would pass about one key's cost
(:data:`KEY_COST_PADDING`); then the smaller count gets a key of its own. That is ski rental: for each count, at
worst about twice the cheaper of "always pad" and "open at once" in hindsight, whatever the run's length. A
shape's new key takes the most slots any key of the run has, so the counts the shape meets later fit under it.
Those two runs now meet 9 and 11 keys (BCCD's new ones in 4 epochs after its fifth). Padding changes neither the
assignment nor the gradients, and the logged losses within rounding (tests/test_loss.py): only the assigner's
``[batch, slots, anchors]`` work grows with it.

``key_cost_padding=0`` keeps the power of two of each batch (every count a key at once), as before.
``benchmarks/graph_keys.py`` replays a run's keys through this book without a GPU.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from detector.loss import box_slots

GraphKey = tuple[tuple[int, ...], int, bool]  # (input shape, box slots, ends with the optimizer step)
Action = Literal["replay", "eager", "capture"]

WARMUP_RUNS = 2  # eager runs of a key before its capture (PyTorch's examples warm up 3; one is cuDNN's autotuning)
# Eager runs of a key whose input shape other keys already ran WARMUP_RUNS times: cuDNN has met every convolution
# of that shape, and what differs (the box slots' assigner and loss shapes, or the optimizer, which warm-up steps
# eagerly) has no autotuning; one run still does any lazy set-up of its own before the capture.
RUNS_FOR_A_KNOWN_SHAPE = 1
MAX_GRAPHS = 64  # keys beyond this run eagerly (sizes x box-slot counts x with/without the optimizer)
# Padding that buys one key, in slot-pixels (images x height x width x slots beyond a batch's own count: the
# assigner's [batch, slots, anchors] work, anchors growing with the pixels). A new key at a known shape costs about
# three steps more than a graphed one (its eager run, at half the graphed rate: one; its capture, whose host time is
# about an eager step's: two). Padding 32 slots costs a step at batch 64 and 640 px about 1 ms of the H100's ~33
# (the assigner's [64, 32, 8400] tensors, 69 MB in FP32, some forty passes over them at ~3 TB/s: 0.9 ms): ~3%, so
# ~100 such steps, 3,200 slot-steps at that batch and size, cost about one key. Both are estimates, not
# measurements: the epochs' graph costs (results.csv) and the step's rate at each count measure them on a GPU.
KEY_COST_PADDING = 3200 * 64 * 640 * 640


def padding_cost(shape: tuple[int, ...], slots: int) -> int:
    """Slot-pixels of ``slots`` padded slots at input ``shape`` ``(batch, channels, height, width)``."""
    return shape[0] * shape[-2] * shape[-1] * slots


def eager_runs(key_runs: int, shape_runs: int) -> int:
    """How many times a key runs eagerly before its capture, given its own eager runs so far and those of every key
    of its input shape (its own included): :data:`WARMUP_RUNS`, or :data:`RUNS_FOR_A_KNOWN_SHAPE` once the other
    keys of its shape ran that often."""
    return RUNS_FOR_A_KNOWN_SHAPE if shape_runs - key_runs >= WARMUP_RUNS else WARMUP_RUNS


@dataclass
class KeyBook:
    """The keys a run has met: their eager runs, which are captured, and the padding spent instead of new keys.

    :meth:`key` chooses a step's key (its box slots), :meth:`action` says what the step does with it, and
    :meth:`ran_eagerly` / :meth:`captured` record what it did.
    """

    key_cost_padding: int = KEY_COST_PADDING
    max_graphs: int = MAX_GRAPHS
    runs: Counter[GraphKey] = field(default_factory=Counter)  # eager runs per key
    shape_runs: Counter[tuple[int, ...]] = field(default_factory=Counter)  # eager runs per input shape, all its keys
    graphs: set[GraphKey] = field(default_factory=set)  # captured keys
    padding: Counter[GraphKey] = field(default_factory=Counter)  # slot-pixels padded for a key not opened yet
    retired: set[GraphKey] = field(default_factory=set)  # keys that run no more (warm-up's, once it is over)
    most_slots: int = 0  # the largest count any key of the run took

    def key(self, shape: tuple[int, ...], most_boxes: int, with_optimizer: bool) -> GraphKey:
        """The key of a step of input ``shape`` whose fullest image holds ``most_boxes`` boxes."""
        needed = box_slots(most_boxes)
        own: GraphKey = (shape, needed, with_optimizer)
        if self.key_cost_padding <= 0:
            return own
        larger = [key[1] for key in self.known() if key[0] == shape and key[2] == with_optimizer and key[1] >= needed]
        if larger:
            slots = min(larger)
            if slots == needed:
                return own
            cost = padding_cost(shape, slots - needed)
            if self.padding[own] + cost <= self.key_cost_padding:
                self.padding[own] += cost
                return shape, slots, with_optimizer
            return own  # more padding would cost more than a key: this count gets its own
        slots = max(needed, self.most_slots)
        self.most_slots = slots
        return shape, slots, with_optimizer

    def known(self) -> set[GraphKey]:
        """Keys that ran eagerly or were captured (a padded step can take either)."""
        return ({key for key, runs in self.runs.items() if runs} | self.graphs) - self.retired

    def action(self, key: GraphKey) -> Action:
        """Replay a captured key; run it eagerly while it warms up (or once :attr:`max_graphs` are taken); else
        capture it."""
        if key in self.graphs:
            return "replay"
        if len(self.graphs) >= self.max_graphs or self.runs[key] < eager_runs(self.runs[key], self.shape_runs[key[0]]):
            return "eager"
        return "capture"

    def ran_eagerly(self, key: GraphKey) -> None:
        self.runs[key] += 1
        self.shape_runs[key[0]] += 1

    def captured(self, key: GraphKey) -> None:
        self.graphs.add(key)

    def retire_partial_steps(self) -> list[GraphKey]:
        """Warm-up is over and no accumulation follows: keys of steps without the optimizer run no more, and no step
        is padded to them. Returns them (captured or not); their eager runs stay counted (cuDNN met their shapes)."""
        partial = {key for key in self.known() if not key[2]}
        self.retired |= partial
        self.graphs -= partial
        return sorted(partial)

    def clear(self) -> None:
        """After a failed capture: nothing is captured any more."""
        self.graphs.clear()
