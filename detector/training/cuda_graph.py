"""CUDA graphs of the training step (``--cuda-graphs``): its kernels recorded once per input shape, then replayed.

A YOLOv8n step at batch 64 launches thousands of small kernels; the host spends longer launching them than the
GPU spends running them (issue 29: the step ran at ~3% of an H100's FP16 arithmetic). At a fixed shape the
kernel sequence never changes, so a CUDA graph records it once and replays it with one launch.

What the graph holds, and what makes it replayable (the engine's body is in detector/training/engine.py):

- **Fixed shapes.** One graph per key: the input ``(batch, 3, size, size)`` of the multi-scale list, the box
  count the targets are padded to (:func:`detector.loss.box_slots`, with a mask: the same loss bit for bit,
  tests/test_loss.py), and whether the step ends with the optimizer (gradient accumulation). Every graph
  draws from one memory pool (``graph_pool_handle``): only one runs at a time, and what each hands back
  stays referenced, so a later capture reuses only memory that no graph still reads.
- **Static inputs.** A step's input is made in its key's image buffer (or copied there) and its targets copied
  into their buffers (:class:`StaticBatch`), then the graph replays. Every input shape's image buffer is a view of
  one memory, sized for the run's largest input, and keys of one box count share the targets'
  (:class:`StaticInputs`): each is filled right before its own replay, on the same stream. Values that change every
  step live in device tensors that the host fills before the replay (a fill is a kernel launch, not a wait): the
  learning rate of each parameter group (fused SGD and AdamW read a tensor ``lr``) and the EMA weight
  (:class:`DeviceEMA`).
- **Baked values.** Momentum (AdamW's beta1) is recorded as a constant (fused kernels take it as a number), and
  warm-up ramps it every step: there the engine replays graphs of the forward and backward passes only (keys
  without the optimizer, as for accumulation's micro-steps) and steps the optimizer eagerly after them, and from
  the first step after warm-up whole steps (warm-up's graphs are dropped then, unless accumulation's
  micro-steps will replay them). Accumulation bakes nothing: it only picks the key.
- **No host syncs inside.** Targets are padded on the host before the copy; the loss computes a fixed number of
  anchors an image (no boolean indexing: :func:`detector.loss.foreground_losses`); gradients stay allocated
  between steps (zeroed, never set to None), so every graph accumulates into the same tensors.
- **FP16 loss scaling, captured as it is.** GradScaler keeps its scale and growth tracker in device tensors.
  With a fused optimizer it hands its inf/NaN check (``found_inf``) to the optimizer kernel, which skips the
  update on the device, and ``update()`` is one in-place kernel (``_amp_update_scale_``): the dynamic scale
  keeps halving and growing inside the graph. BF16/FP32 steps hand the same flag (a non-finite gradient
  norm) to the fused kernel themselves (:func:`skip_on_device`).
- **Warm-up and fallback.** A key's first runs go eagerly on a side stream (cuDNN autotuning, lazy state;
  fewer for a key whose input shape other keys have run); the next is captured and replayed. Which key a step
  takes (a batch may be padded to a box count its shape has a key for) and when it is captured is the
  :class:`~detector.training.graph_keys.KeyBook`'s. A capture that fails prints one line and the run goes on
  eagerly.

Never reached on the CPU: :func:`graphs_unavailable` answers first, and only a CUDA device gets past it.
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from detector.choices import CUDA_GRAPHS as CHOICES
from detector.inference.cuda_graph import capturing, end_failed_capture
from detector.loss import PaddedTargets
from detector.training.ema import ModelEMA
from detector.training.graph_keys import GraphKey, KeyBook


def graphs_unavailable(choice: str, device: torch.device, *, world_size: int) -> str | None:
    """Why ``--cuda-graphs choice`` cannot capture here, or None when it can try."""
    if choice not in CHOICES:
        raise ValueError(f"--cuda-graphs must be one of {', '.join(CHOICES)} (got {choice!r})")
    if choice == "off":
        return "--cuda-graphs off"
    if device.type != "cuda":
        return f"needs a CUDA device (training on {device.type})"
    if world_size > 1:
        return "not under torchrun: the DDP gradient all-reduce is not captured"
    return None


@dataclass
class GraphCosts:
    """Counts of what the graphs cost the training loop: keys captured, the host seconds their captures took, and
    steps run eagerly before a capture (or past :data:`~detector.training.graph_keys.MAX_GRAPHS`). Every new key
    (input size x box slots x optimizer or not) pays them once; a short run that meets many keys pays them in its
    first epochs."""

    captures: int = 0
    capture_seconds: float = 0.0
    eager_steps: int = 0

    def since(self, earlier: "GraphCosts") -> dict[str, float]:
        """The epoch's share, as ``results.csv`` columns: what was added since ``earlier`` (a copy taken then)."""
        return {"graph_captures": self.captures - earlier.captures,
                "graph_capture_seconds": self.capture_seconds - earlier.capture_seconds,
                "graph_eager_steps": self.eager_steps - earlier.eager_steps}


@dataclass
class StaticBatch:
    """A graph's input buffers: float model input ``[B, 3, S, S]``, padded targets, and ``earlier_finite``
    (0-dim bool: every loss since the last optimizer step was finite)."""

    images: torch.Tensor
    targets: PaddedTargets
    earlier_finite: torch.Tensor

    def fill(self, images: torch.Tensor, targets: PaddedTargets, earlier_finite: torch.Tensor) -> None:
        # A step input made in this buffer (StaticInputs.image_buffer) is the buffer itself. Another tensor over the
        # same memory with other strides would make copy_ refuse the overlap, loudly: never a silent mix.
        if images is not self.images:
            self.images.copy_(images)
        for static, given in zip(self.targets, targets):
            static.copy_(given, non_blocking=True)
        self.earlier_finite.copy_(earlier_finite)


class StaticInputs:
    """The graphs' input buffers, shared wherever keys allow: one image memory for every input shape, one set of
    target buffers per padded shape, one ``earlier_finite``.

    Every key's image buffer is a view of the front of one byte buffer (:attr:`images_memory`), sized for the
    largest input the run will take (:meth:`image_buffer`'s ``largest_side``). A buffer per input shape cost their
    sum: at batch 64 in FP32, the five sizes 576-704 px of the default multi-scale list held 1.6 GB of buffers
    beside one 704-px step's 0.38 GB. Sharing is safe because every step fills the buffers of its own key right
    before its replay (or eager run), on the same stream, and nothing a step hands back reads its images.
    """

    def __init__(self) -> None:
        self.images: dict[tuple, torch.Tensor] = {}
        self.targets: dict[tuple, PaddedTargets] = {}
        self.earlier_finite: torch.Tensor | None = None
        self.images_memory: torch.Tensor | None = None  # uint8, flat

    def for_batch(self, images: torch.Tensor, targets: PaddedTargets) -> StaticBatch:
        """Buffers shaped like ``images`` (the same strides: channels-last stays) and ``targets``; ``images`` itself
        where it is the buffer :meth:`image_buffer` gave."""
        image_key = (tuple(images.shape), images.stride(), images.dtype)
        static_images = self.images.get(image_key)
        if static_images is None:
            dense = images.is_contiguous() or images.is_contiguous(memory_format=torch.channels_last)
            static_images = self.images[image_key] = (
                self._view(images.shape, images.stride(), images.dtype, images.device, largest_side=0) if dense
                else torch.empty_like(images))
        target_key = tuple((tuple(t.shape), t.dtype) for t in targets)
        static_targets = self.targets.get(target_key)
        if static_targets is None:
            static_targets = self.targets[target_key] = PaddedTargets(
                *(torch.empty_like(t, device=images.device) for t in targets))
        if self.earlier_finite is None:
            self.earlier_finite = torch.ones((), dtype=torch.bool, device=images.device)
        return StaticBatch(static_images, static_targets, self.earlier_finite)

    def image_buffer(self, shape: tuple[int, int, int, int], device: torch.device, *, channels_last: bool,
                     largest_side: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The ``dtype`` image buffer that :meth:`for_batch` gives a batch of ``shape`` in that layout, made now if
        new: a step input made in it (:func:`detector.training.step_input.step_input`'s ``out``) needs no copy.
        ``largest_side``: the largest square input the run's steps take, so the memory is made once, at that size."""
        layout = torch.channels_last if channels_last else torch.contiguous_format
        stride = torch.empty(shape, device="meta", memory_format=layout).stride()
        key = (tuple(shape), stride, dtype)
        buffer = self.images.get(key)
        if buffer is None:
            buffer = self.images[key] = self._view(shape, stride, dtype, device, largest_side=largest_side)
        return buffer

    def _view(self, shape: Sequence[int], stride: tuple[int, ...], dtype: torch.dtype, device: torch.device, *,
              largest_side: int) -> torch.Tensor:
        """A view of :attr:`images_memory` (dense in its layout). Memory too small for it is replaced by a larger
        one, made for ``largest_side`` where given; the views made before keep the old memory alive for their keys."""
        pixels = shape[-2] * shape[-1]
        size = math.prod(shape) * dtype.itemsize
        memory = self.images_memory
        elsewhere = memory is not None and (memory.device.type != device.type  # "cuda" names the current GPU
                                            or device.index not in (None, memory.device.index))
        if memory is None or memory.numel() < size or elsewhere:
            wanted = max(size, size // pixels * largest_side**2)
            memory = self.images_memory = torch.empty(wanted, dtype=torch.uint8, device=device)
        return memory[:size].view(dtype).as_strided(tuple(shape), stride)

    def clear(self) -> None:
        self.images.clear()
        self.targets.clear()
        self.earlier_finite = None
        self.images_memory = None


class DeviceEMA:
    """The EMA step with its weight in a device tensor: a graph reads the weight at replay instead of baking in
    the value it had at capture. Host side, :meth:`advance` counts the update and fills the weight."""

    def __init__(self, ema: ModelEMA, model: torch.nn.Module) -> None:
        self.ema = ema
        self.targets = [v for v in ema.module.state_dict().values() if v.dtype.is_floating_point]
        self.sources = [v for v in model.state_dict().values() if v.dtype.is_floating_point]
        self.weight = torch.zeros((), device=self.targets[0].device)

    def advance(self) -> None:
        self.ema.updates += 1
        self.weight.fill_(1 - self.ema.current_decay())

    def retreat(self) -> None:
        """Undo :meth:`advance` (the step it was for ran on the eager path, which counts for itself)."""
        self.ema.updates -= 1

    @torch.no_grad()
    def update(self) -> None:
        """``ema += weight * (model - ema)``: three fused multi-tensor kernels, nothing read on the host."""
        differences = torch._foreach_sub(self.sources, self.targets)
        torch._foreach_mul_(differences, self.weight)
        torch._foreach_add_(self.targets, differences)


def skip_on_device(optimizer: torch.optim.Optimizer, finite: torch.Tensor) -> None:
    """Step a fused optimizer unless ``finite`` (0-dim bool) is False, decided by its kernel on the device.

    The ``found_inf`` attribute is GradScaler's own handover to fused optimizers (torch/amp/grad_scaler.py):
    the kernel skips the update where it is 1. Without a scaler (BF16/FP32) the eager step decides on the
    host instead, a sync that a graph cannot hold.
    """
    optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]


Body = Callable[[StaticBatch, bool], dict[str, torch.Tensor]]


class StepGraphs:
    """The captured training steps of one run, keyed by :data:`GraphKey`, sharing one memory pool.

    ``body(batch, with_optimizer)`` is the step on static buffers; it must keep gradients allocated (the first
    eager run's backward allocates them, zeroing never frees them). It runs eagerly for a key's first calls, then
    is captured and replayed (:attr:`book` decides). ``ema``: the body's EMA, whose weight the caller fills before
    each step that ends with the optimizer.
    """

    def __init__(self, body: Body, *, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                 ema: DeviceEMA | None, log: Callable[[str], None] = print) -> None:
        self.body, self.optimizer, self.scaler, self.ema, self.log = body, optimizer, scaler, ema, log
        device = optimizer.param_groups[0]["params"][0].device
        self.learning_rates = [torch.zeros(1, device=device) for _ in optimizer.param_groups]
        self.pool = torch.cuda.graph_pool_handle()
        self.side = torch.cuda.Stream(device)
        self.inputs = StaticInputs()
        self.batches: dict[GraphKey, StaticBatch] = {}
        self.graphs: dict[GraphKey, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}
        self.book = KeyBook()  # which key each step takes, and when each is captured (detector/training/graph_keys.py)
        self.failed: str | None = None
        # What the graphs cost the loop so far (each epoch reports its share: GraphCosts): a key's eager runs go at
        # eager speed, and a capture records the step's launches and instantiates the graph, on the host.
        self.costs = GraphCosts()

    @property
    def runs(self) -> Counter[GraphKey]:
        """Eager runs per key so far."""
        return self.book.runs

    def run(self, key: GraphKey, images: torch.Tensor, targets: PaddedTargets,
            earlier_finite: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """One step; its outputs (valid until the next call). None after a failed capture: step eagerly."""
        if self.failed is not None:
            return None
        if key not in self.batches:
            self.batches[key] = self.inputs.for_batch(images, targets)
        batch = self.batches[key]
        batch.fill(images, targets, earlier_finite)
        for learning_rate, group in zip(self.learning_rates, self.optimizer.param_groups):
            learning_rate.fill_(group["lr"])
        action = self.book.action(key)
        if action == "replay":
            graph, outputs = self.graphs[key]
            graph.replay()
            return outputs
        with tensor_learning_rates(self.optimizer, self.learning_rates):
            if action == "eager":
                self.book.ran_eagerly(key)
                self.costs.eager_steps += 1
                return self._eager(batch, key)
            began = time.perf_counter()
            try:
                graph = torch.cuda.CUDAGraph()
                # The step's own side stream (its device's), not torch's process-wide default capture stream; the
                # loader's page-locked batch memory stays cached (capturing), its pin thread keeps working.
                with capturing(graph, pool=self.pool, stream=self.side):
                    outputs = self.body(batch, key[2])
            except Exception as error:  # a host sync or an uncapturable kernel inside the step (any error type)
                self._give_up(error)
                return None
        if not self.graphs:
            self.log(f"cuda graphs: on (first capture: input {list(key[0])}, {key[1]} box slots)")
        self.graphs[key] = graph, outputs
        self.book.captured(key)
        graph.replay()  # capturing records the kernels without running them: this step runs now
        self.costs.captures += 1
        self.costs.capture_seconds += time.perf_counter() - began
        return outputs

    def forget_partial_steps(self) -> None:
        """Drop the graphs of steps that end without the optimizer: warm-up's, once warm-up is over and no
        accumulation follows. They would never replay again, and they counted against
        :data:`~detector.training.graph_keys.MAX_GRAPHS` (five sizes x a few box-slot counts each: a run's later
        keys could have found the limit taken and run eagerly).
        Their input buffers stay (:class:`StaticInputs`: shared with the whole steps' keys of the same shapes).
        The device finishes what it queued first (once a run), so no graph goes while a replay of it may run."""
        partial = self.book.retire_partial_steps()  # the book takes no step to them any more
        for key in partial:
            self.batches.pop(key, None)
        captured = [key for key in partial if key in self.graphs]
        if not captured:
            return
        torch.cuda.current_stream(self.side.device).synchronize()
        for key in captured:
            del self.graphs[key]
        if not self.graphs:
            # No graph holds the pool any more: the allocator may release it, and a later capture that named it
            # again would fail its use-count check (and the run would train eagerly). The next capture takes a
            # fresh one, as a precision fallback's new StepGraphs does. The old one's memory goes back now (the
            # device finished above), not at the next capture, after the eager steps that come first.
            self.pool = torch.cuda.graph_pool_handle()
            torch.cuda.empty_cache()

    def _eager(self, batch: StaticBatch, key: GraphKey) -> dict[str, torch.Tensor]:
        """The body run eagerly on the side stream, as PyTorch asks before a capture."""
        main = torch.cuda.current_stream()
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            outputs = self.body(batch, key[2])
        main.wait_stream(self.side)
        for tensor in outputs.values():  # read on the main stream: keep their memory until it has
            tensor.record_stream(main)
        return outputs

    def _give_up(self, error: BaseException) -> None:
        """After a failed capture nothing of the step ran: the allocator is told the capture ended, and the host-side
        bookkeeping is reset."""
        self.failed = capture_failure(error)
        self.log(f"cuda graphs: capture failed ({self.failed}); training on without graphs")
        end_failed_capture(self.side.device, self.pool)
        self.book.clear()
        self.graphs.clear()  # never replayed again: their static buffers and their share of the pool go with them
        self.batches.clear()
        self.inputs.clear()
        for name in ("found_inf", "grad_scale"):
            if hasattr(self.optimizer, name):
                delattr(self.optimizer, name)
        # GradScaler's per-optimizer stage (unscaled / stepped) is host state the failed capture may have moved.
        self.scaler._per_optimizer_states.clear()
        # The graphs' pool and the eager warm-up's blocks on the side stream (a step's activations each), which the
        # eager steps from now on, on the main stream, could not reuse: back to the GPU, not held for the run.
        torch.cuda.synchronize(self.side.device)
        torch.cuda.empty_cache()


@contextlib.contextmanager
def tensor_learning_rates(optimizer: torch.optim.Optimizer, learning_rates: list[torch.Tensor]) -> Iterator[None]:
    """The optimizer reads ``learning_rates`` (device tensors, one per param group) while the block runs, and may be
    captured; its param groups hold plain floats again afterwards, so checkpoints and the schedule see what they
    always did."""
    groups = optimizer.param_groups
    saved = [(group["lr"], group.get("capturable")) for group in groups]
    for group, learning_rate in zip(groups, learning_rates):
        group["lr"] = learning_rate
        if "capturable" in group:  # AdamW refuses capture unless its groups say capturable
            group["capturable"] = True
    try:
        with warnings.catch_warnings():
            # The eager runs before a capture are meant: torch's advice to drop capturable=True is not for us.
            warnings.filterwarnings("ignore", message="This instance was constructed with capturable=True")
            yield
    finally:
        for group, (learning_rate, capturable) in zip(groups, saved):
            group["lr"] = learning_rate
            if capturable is not None:
                group["capturable"] = capturable


def capture_failure(error: BaseException) -> str:
    """One line for a failed capture: the first error and where our code (or torchvision's) met it.

    What reaches the caller is CUDA's "operation failed due to a previous error during capture", raised when the
    capture ends; the error that broke it (a host read, an uncapturable call) is its ``__context__``. That one
    names the problem, and its innermost frame in detector or torchvision names the line to change.
    """
    first = error
    while first.__context__ is not None and first.__context__ is not error:
        first = first.__context__
    text = next((line.strip() for line in str(first).splitlines() if line.strip()), type(first).__name__)
    where = innermost_ours(traceback.extract_tb(first.__traceback__))
    return f"{text}, at {where}" if where else text


def innermost_ours(frames: list[traceback.FrameSummary]) -> str | None:
    """``detector/loss.py:150`` or ``torchvision/ops/_utils.py:103``: the innermost of ``frames`` (outermost first,
    as ``traceback`` lists them) in detector's or torchvision's own files; None when none is."""
    import importlib.util

    vision = importlib.util.find_spec("torchvision")  # its folder, without importing it (detector/nms.py)
    folders = (vision.submodule_search_locations if vision is not None else None) or []
    packages = [Path(__file__).resolve().parents[1], *(Path(folder).resolve() for folder in folders)]
    for frame in reversed(frames):
        path = Path(frame.filename).resolve()
        for package in packages:
            if path.is_relative_to(package):
                return f"{package.name}/{path.relative_to(package).as_posix()}:{frame.lineno}"
    return None
