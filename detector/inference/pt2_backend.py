"""AOTInductor backend for ``.pt2`` packages written by :func:`detector.exporting.pt2.export_pt2`.

The package is native code plus weights; loading it needs torch but neither a compiler nor the model's
Python code. Its batch dimension is free, so any batch runs in one call; height and width are fixed.

On CUDA the package's run (and the uint8 input's scaling before it) is replayed from a CUDA graph, one per batch
size, captured on first use (:class:`~detector.inference.cuda_graph.CudaGraphRunner`), as the PyTorch backend's
forward is: at batch 1 a nano model's kernels are too short to keep the GPU busy between launches, and the
package's C++ runner launches each one from the host. A capture that fails says so once and the package runs as
compiled. The package is loaded without its runner's thread synchronisation (``run_single_threaded``, whose waits
a capture may not hold); a backend is called from one thread at a time.
"""

from __future__ import annotations

import inspect
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from detector.inference.backend import Backend, RawOutputs
from detector.inference.cuda_graph import CudaGraphRunner, Outputs
from detector.inference.preprocess import model_input
from detector.model.metadata import decode_metadata
from detector.postprocess import NMSConfig

AOTI_KEY_PREFIX = "AOTI_"  # AOTInductor's own entries beside ours in the package metadata (platform, ISA, device)


class Pt2Backend(Backend):
    """``torch._inductor.aoti_load_package`` behind the :class:`Backend` interface.

    Args:
        path: the ``.pt2`` file.
        device: must be the kind of device the package was compiled for (``cpu`` or ``cuda[:N]``).
    """

    def __init__(self, path: str | Path, *, device: str = "cpu", nms: NMSConfig | None = None) -> None:
        self.device = torch.device(device)
        index = self.device.index if self.device.type == "cuda" and self.device.index is not None else -1
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such pt2 package")
        if not zipfile.is_zipfile(path):  # before torch, which logs a misleading "outdated pt2 file" warning first
            raise ValueError(f"{path}: not a loadable pt2 package (not a zip archive)")
        # Without the runner's own thread synchronisation where it can go, which a CUDA graph's capture cannot hold
        # (torch's advice for CUDA graphs); an older torch's loader may lack the switch.
        options = ({"run_single_threaded": True} if self.device.type == "cuda" and "run_single_threaded"
                   in inspect.signature(torch._inductor.aoti_load_package).parameters else {})
        try:
            self.runner = torch._inductor.aoti_load_package(str(path), device_index=index, **options)
        except Exception as error:  # torch's own (zip, C++ loader) errors: a bad file, never a bug of ours
            reason = " ".join(str(error).split())[:200] or type(error).__name__
            raise ValueError(f"{path}: not a loadable pt2 package ({reason})") from None
        props = self.runner.get_metadata()
        compiled_for = props.get("AOTI_DEVICE_KEY", "cpu")
        if compiled_for != self.device.type:
            raise ValueError(f"{path}: compiled for {compiled_for}, asked to run on {self.device}; "
                             f"export it again with --device {self.device.type}")
        ours = {key: value for key, value in props.items() if not key.startswith(AOTI_KEY_PREFIX)}
        info = decode_metadata(ours, source=str(path))
        super().__init__(info, nms)
        self.forward: Callable[[torch.Tensor], Outputs] = self.run
        if self.device.type == "cuda":
            self.forward = CudaGraphRunner(self.run)  # a graph per batch size: the height and width are fixed

    @property
    def free_batch(self) -> bool:  # a fixed size (info.dynamic is false), but every package takes any batch
        return True

    @property
    def name(self) -> str:  # type: ignore[override]  # what ran: a failed capture leaves the package's own run
        base = f"pt2 {self.info.precision}" + (" +nms" if self.info.nms else "")
        if not isinstance(self.forward, CudaGraphRunner):
            return base
        return base + (" cuda graph" if self.forward.failed is None else " eager")

    def run(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """uint8 ``[B, 3, H, W]`` on the device -> the package's outputs; the scaling to [0, 1] is part of a graph."""
        return tuple(self.runner(model_input(images, self.device, channels_last=False)))

    @torch.inference_mode()
    def infer(self, images: torch.Tensor) -> RawOutputs:
        self.check_input(images)
        if self.device.type != "cuda":
            return self.run(images)  # type: ignore[return-value]  # boxes and scores, or NMS's two outputs
        # AOTInductor's CUDA runner launches on the current stream of the *current* device: on cuda:1 with cuda:0
        # current that is another GPU's stream, unordered with this input's upload (as TensorRT's backend does).
        # CudaGraphRunner makes the input's device current around its calls.
        return self.forward(images.to(self.device, non_blocking=True))  # type: ignore[return-value]
