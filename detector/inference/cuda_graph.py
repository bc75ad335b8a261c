"""A fixed-shape function replayed from a CUDA graph: one graph per input shape and dtype, captured on first use.

At batch 1 a nano model is bound by kernel launches, not arithmetic (the issue's H100 figures: FP16 autocast
slower than FP32). A graph launches the whole forward as one unit. GPU-only: nothing here runs on the CPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

WARMUP_CALLS = 3  # cuDNN picks its algorithms and the caching allocator settles before capture


@dataclass
class CapturedGraph:
    graph: torch.cuda.CUDAGraph
    static_input: torch.Tensor  # copy each call's input here, then replay
    static_output: torch.Tensor  # overwritten by every replay: clone before the next one


class CudaGraphRunner:
    """``runner(x) -> function(x)``, for a ``function`` of one CUDA tensor returning one tensor.

    The output is a fresh tensor (a clone of the graph's static output), so results of earlier calls stay
    valid. Each distinct ``(shape, dtype, strides)`` is captured once and kept, in one memory pool per device.
    If a capture fails, the runner says so in one warning and runs ``function`` eagerly from then on
    (:attr:`failed` holds the error).
    """

    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.function = function
        self.graphs: dict[tuple, CapturedGraph] = {}
        # One memory pool per device for all of its graphs: they never run at once, and every replay's output is
        # cloned before the next, so a new shape costs its own activations only once, not a pool of its own.
        self.pools: dict[torch.device, tuple] = {}
        self.failed: str | None = None  # the capture's error, once one failed: every call runs eagerly

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        if inputs.device.type != "cuda":
            raise ValueError(f"CUDA graphs replay on a GPU; got a tensor on {inputs.device}")
        key = (tuple(inputs.shape), inputs.dtype, inputs.stride(), inputs.device)
        captured = self.graphs.get(key)
        # torch.cuda.graph captures on a stream of the current device: on cuda:1 with cuda:0 current it would
        # record nothing of this input's work, and every replay would return the first call's output.
        with torch.cuda.device(inputs.device):
            if captured is None and self.failed is None:
                captured = self.capture(inputs)
            if captured is None:
                return self.function(inputs)
            self.graphs[key] = captured
            captured.static_input.copy_(inputs)
            captured.graph.replay()
            return captured.static_output.clone()

    def capture(self, inputs: torch.Tensor) -> CapturedGraph | None:
        """The graph of ``function`` for inputs like ``inputs``, or None when capturing fails (:attr:`failed`)."""
        static_input = inputs.clone()
        side = torch.cuda.Stream(inputs.device)  # warm-up on a side stream, as torch.cuda.graphs asks
        side.wait_stream(torch.cuda.current_stream(inputs.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.function(static_input)
        torch.cuda.current_stream(inputs.device).wait_stream(side)
        graph, main = torch.cuda.CUDAGraph(), torch.cuda.current_stream(inputs.device)
        try:
            # On the side stream made for this device: torch.cuda.graph's default capture stream is one for the
            # whole process, made on whichever device was current at the first capture, so a second GPU would record
            # nothing. thread_local: `val`'s loader pins batches on a thread of its own, whose CUDA calls (pinned
            # allocations) would otherwise invalidate a capture running beside them (training's graphs do the same).
            with torch.cuda.graph(graph, pool=self.pools.get(inputs.device), stream=side,
                                  capture_error_mode="thread_local"):
                static_output = self.function(static_input)
        except Exception as error:  # an uncapturable operation, any error type: the eager forward still works
            # torch.cuda.graph's exit ends the capture before restoring the stream: when ending raises, this thread
            # would stay on the side stream.
            torch.cuda.set_stream(main)
            lines = str(error).strip().splitlines()
            self.failed = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
            warnings.warn(f"cuda graphs: capture failed ({self.failed}); inference runs eagerly", stacklevel=3)
            return None
        self.pools.setdefault(inputs.device, graph.pool())
        return CapturedGraph(graph, static_input, static_output)
