"""A fixed-shape function replayed from a CUDA graph: one graph per input shape and dtype, captured on first use.

At batch 1 a nano model is bound by kernel launches, not arithmetic (the issue's H100 figures: FP16 autocast
slower than FP32). A graph launches the whole forward as one unit: PyTorch's forward (detector/inference/
torch_backend.py), training's validation forward, and the compiled pt2 package's run (pt2_backend.py). GPU-only:
nothing here runs on the CPU.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

Outputs = torch.Tensor | tuple[torch.Tensor, ...]  # what a graphed function returns: one tensor, or several

WARMUP_CALLS = 3  # cuDNN picks its algorithms and the caching allocator settles before capture


@dataclass
class CapturedGraph:
    graph: torch.cuda.CUDAGraph
    static_input: torch.Tensor  # copy each call's input here, then replay
    static_output: Outputs  # overwritten by every replay: clone before the next one


def clone_outputs(outputs: Outputs) -> Outputs:
    return tuple(output.clone() for output in outputs) if isinstance(outputs, tuple) else outputs.clone()


def output_bytes(outputs: Outputs) -> int:
    return sum(output.nbytes for output in outputs) if isinstance(outputs, tuple) else outputs.nbytes


@contextmanager
def capturing(graph: torch.cuda.CUDAGraph, *, pool: tuple[int, int], stream: torch.cuda.Stream) -> Iterator[None]:
    """Capture the block into ``graph``: ``torch.cuda.graph(graph, pool=pool, stream=stream,
    capture_error_mode="thread_local")`` without emptying the host's page-locked memory cache first.

    ``torch.cuda.graph`` empties both of torch's caches as it begins, "to free as much memory as we can for the
    graph". The GPU's cached blocks can make room for a capture, so they are still given back here; the host's
    cannot (a graph holds GPU memory only), and giving them back cost every capture the training loader's
    page-locked batch memory (a mosaic batch's atlas at 640 px and batch 64 takes a 256-MiB block): each block was
    freed (``cudaFreeHost`` waits for the GPU) and page-locked again by the pin thread while the steps waited for
    its batches, at each of a multi-scale run's captures. thread_local: the loader's pin thread keeps calling CUDA
    (page-locked allocations) while this thread captures. The capture is ended, and the stream restored, when the
    block raises, and when ending it raises (``torch.cuda.graph`` leaves the thread on the capture stream then).
    """
    torch.cuda.synchronize(stream.device)
    torch.cuda.empty_cache()
    with torch.cuda.stream(stream):
        graph.capture_begin(pool, capture_error_mode="thread_local")
        try:
            yield
        finally:
            graph.capture_end()


def end_failed_capture(device: torch.device, pool: tuple[int, int]) -> None:
    """Tell torch's caching allocator that a capture into ``pool`` is over, after the capture failed.

    Older torch releases check ``cudaStreamEndCapture``'s error before telling the allocator that the capture
    ended (pytorch's CUDAGraph.cpp now ends it first), so after a capture that failed there the allocator thinks one
    is still underway for the rest of the process: it frees no cached memory (``empty_cache``, the retry before an
    out-of-memory error) and stops recycling blocks used on other streams, which the eager fallback then pays for.
    Where torch has ended it already, ending it again is refused, and that refusal is ignored.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        torch._C._cuda_endAllocateToPool(index, pool)
    except RuntimeError:  # "not currently recording to mempool_id": torch ended it itself, and releases the pool
        return
    # The capture's start took a use of the pool that only an ended capture gives back (CUDAGraph::reset); without
    # this the pool, and every block the runner's earlier graphs held, stayed reserved for the process. As torch's
    # own use_mem_pool pairs the two calls.
    torch._C._cuda_releasePool(index, pool)


class CudaGraphRunner:
    """``runner(x) -> function(x)``, for a ``function`` of one CUDA tensor returning one tensor or a tuple of them.

    The output is fresh (a clone of the graph's static output), so results of earlier calls stay valid. Each
    distinct ``(shape, dtype, strides)`` is captured once and kept, in one memory pool per device, up to
    ``max_graphs`` graphs and ``max_output_bytes`` of their static outputs (which stay allocated while the runner
    lives); inputs of other shapes run ``function`` eagerly. If a capture fails, the runner says so in one warning
    and runs ``function`` eagerly from then on (:attr:`failed` holds the error).
    """

    def __init__(self, function: Callable[[torch.Tensor], Outputs], *, max_graphs: float = math.inf,
                 max_output_bytes: float = math.inf, input_bytes: int = 0) -> None:
        self.function = function
        self.max_graphs, self.max_output_bytes = max_graphs, max_output_bytes
        # input_bytes > 0: every shape's static input that fits is a view of one memory of that many bytes per
        # device, not a copy of its own: they never replay at once, and each call copies its input in first.
        # Validation's rectangular batches are several shapes (up to 79 MB each at 64 x 640 px), held for the run.
        self.input_bytes = input_bytes
        self.input_memory: dict[torch.device, torch.Tensor] = {}
        self.graphs: dict[tuple, CapturedGraph] = {}
        self.uncaptured: set[tuple] = set()  # shapes over the limits: always eager
        # One memory pool per device for all of its graphs: they never run at once, and every replay's output is
        # cloned before the next, so a new shape costs its own activations only once, not a pool of its own. One
        # capture stream per device too: the allocator reuses a freed block only for the stream it was freed on, so
        # captures on streams of their own would each have kept their own activations in the "shared" pool.
        self.pools: dict[torch.device, tuple[int, int]] = {}
        self.streams: dict[torch.device, torch.cuda.Stream] = {}
        self.failed: str | None = None  # the capture's error, once one failed: every call runs eagerly

    def __call__(self, inputs: torch.Tensor) -> Outputs:
        if inputs.device.type != "cuda":
            raise ValueError(f"CUDA graphs replay on a GPU; got a tensor on {inputs.device}")
        key = (tuple(inputs.shape), inputs.dtype, inputs.stride(), inputs.device)
        captured = self.graphs.get(key)
        # torch.cuda.graph captures on a stream of the current device: on cuda:1 with cuda:0 current it would
        # record nothing of this input's work, and every replay would return the first call's output.
        with torch.cuda.device(inputs.device):
            if captured is None:
                room = self.failed is None and key not in self.uncaptured and len(self.graphs) < self.max_graphs
                captured, output = self.capture(inputs) if room else (None, None)
                if captured is None:  # a capture failed, or this shape is over the limits: eagerly
                    self.uncaptured.add(key)
                    return output if output is not None else self.function(inputs)
                self.graphs[key] = captured
            captured.static_input.copy_(inputs)
            captured.graph.replay()
            return clone_outputs(captured.static_output)

    def static_input(self, inputs: torch.Tensor) -> torch.Tensor:
        """A buffer holding ``inputs``, of its shape, dtype and strides: a view of the shared input memory where it
        fits (a dense tensor of at most :attr:`input_bytes`), else a copy of its own."""
        size = inputs.numel() * inputs.element_size()
        dense = inputs.is_contiguous() or inputs.is_contiguous(memory_format=torch.channels_last)
        if not dense or size > self.input_bytes:
            return inputs.clone()
        memory = self.input_memory.get(inputs.device)
        if memory is None:
            memory = self.input_memory[inputs.device] = torch.empty(self.input_bytes, dtype=torch.uint8,
                                                                    device=inputs.device)
        view = memory[:size].view(inputs.dtype).as_strided(inputs.shape, inputs.stride())
        return view.copy_(inputs)

    def capture(self, inputs: torch.Tensor) -> tuple[CapturedGraph | None, Outputs | None]:
        """``(the graph of function for inputs like inputs, None)``; ``(None, function(inputs))`` when its output
        would take the graphs' outputs past ``max_output_bytes`` (known from the first warm-up run, whose output is
        then this call's: no further run), ``(None, None)`` when capturing fails (:attr:`failed`)."""
        static_input = self.static_input(inputs)
        if inputs.device not in self.streams:
            self.streams[inputs.device] = torch.cuda.Stream(inputs.device)
        side = self.streams[inputs.device]  # warm-up on a side stream, as torch.cuda.graphs asks
        main = torch.cuda.current_stream(inputs.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            first = self.function(static_input)
        kept = sum(output_bytes(graph.static_output) for graph in self.graphs.values())
        if kept + output_bytes(first) > self.max_output_bytes:
            main.wait_stream(side)
            for output in first if isinstance(first, tuple) else (first,):
                output.record_stream(main)  # made on the side stream, read on this one: not reused before
            return None, first
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS - 1):
                self.function(static_input)
        main.wait_stream(side)
        del first
        graph = torch.cuda.CUDAGraph()
        if inputs.device not in self.pools:
            self.pools[inputs.device] = torch.cuda.graph_pool_handle()
        pool = self.pools[inputs.device]
        try:
            # On the side stream made for this device: torch.cuda.graph's default capture stream is one for the
            # whole process, made on whichever device was current at the first capture, so a second GPU would record
            # nothing. `val`'s loader pins batches on a thread of its own meanwhile (capturing: thread_local).
            with capturing(graph, pool=pool, stream=side):
                static_output = self.function(static_input)
        except Exception as error:  # an uncapturable operation, any error type: the eager forward still works
            end_failed_capture(inputs.device, pool)
            self.graphs.clear()  # their static buffers are freed with them
            self.input_memory.clear()  # every call runs eagerly from now on
            lines = str(error).strip().splitlines()
            self.failed = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
            warnings.warn(f"cuda graphs: capture failed ({self.failed}); inference runs eagerly", stacklevel=3)
            return None, None
        return CapturedGraph(graph, static_input, static_output), None
