"""AOTInductor backend for ``.pt2`` packages written by :func:`detector.exporting.pt2.export_pt2`.

The package is native code plus weights; loading it needs torch but neither a compiler nor the model's
Python code. Its batch dimension is free, so any batch runs in one call; height and width are fixed.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import torch

from detector.inference.backend import Backend, RawOutputs
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
        try:
            self.runner = torch._inductor.aoti_load_package(str(path), device_index=index)
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
        self.name = f"pt2 {info.precision}" + (" +nms" if info.nms else "")

    @torch.inference_mode()
    def infer(self, images: torch.Tensor) -> RawOutputs:
        self.check_input(images)
        inputs = model_input(images, self.device, channels_last=False)
        if self.device.type != "cuda":
            return tuple(self.runner(inputs))
        # AOTInductor's CUDA runner launches on the current stream of the *current* device: on cuda:1 with cuda:0
        # current that is another GPU's stream, unordered with this input's upload (as TensorRT's backend does).
        with torch.cuda.device(self.device):
            return tuple(self.runner(inputs))
