"""Run a trained or exported detector: one :class:`Backend` interface over PyTorch, ONNX Runtime and TensorRT.

    backend = load_backend("runs/train/exp/weights/best.onnx")
    batch, transforms = prepare_batch([image_rgb], backend.info.imgsz)
    detections = backend(batch)  # letterboxed pixels
    detections = batch_to_original_pixels(detections, transforms)  # original pixels, on the CPU
"""

from __future__ import annotations

from pathlib import Path

from detector.inference.backend import Backend, RawOutputs, unpack_detections
from detector.inference.preprocess import Detections, batch_to_original_pixels, prepare_batch, to_original_pixels
from detector.postprocess import NMSConfig
from detector.runs import newest_file

SUFFIXES = (".pt", ".onnx", ".engine", ".pt2")

__all__ = [
    "Backend", "Detections", "RawOutputs", "SUFFIXES", "exported_precision_note", "find_latest_checkpoint",
    "load_backend", "weights_or_latest",
    "batch_to_original_pixels", "prepare_batch", "to_original_pixels", "unpack_detections",
]


def load_backend(
    weights: str | Path, *, device: str = "cpu", precision: str = "fp32", imgsz: int | None = None,
    nms: NMSConfig | None = None,
) -> Backend:
    """Pick the runtime by suffix: ``.pt`` PyTorch, ``.onnx`` ONNX Runtime, ``.engine`` TensorRT, ``.pt2``
    AOTInductor.

    ``precision`` (fp32 | fp16 | bf16: the weights converted, see :class:`TorchBackend`) and ``imgsz`` apply
    to ``.pt`` only; exported files carry their own in their metadata.
    """
    path = Path(weights)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: weights not found")
    suffix = path.suffix.lower()
    if suffix == ".pt":
        from detector.inference.torch_backend import TorchBackend

        return TorchBackend.from_checkpoint(path, imgsz=imgsz, device=device, precision=precision, nms=nms)
    if suffix == ".onnx":
        from detector.inference.onnx_backend import OnnxBackend

        return OnnxBackend(path, device=device, nms=nms)
    if suffix == ".engine":
        from detector.inference.tensorrt_backend import TensorRTBackend

        return TensorRTBackend(path, device=device if device.startswith("cuda") else "cuda", nms=nms)
    if suffix == ".pt2":
        from detector.inference.pt2_backend import Pt2Backend

        return Pt2Backend(path, device=device, nms=nms)
    raise ValueError(f"{path}: unknown weights type {suffix!r}; expected one of {', '.join(SUFFIXES)}")


def exported_precision_note(weights: str | Path, backend: Backend, *, half: bool, fp32: bool = False) -> str | None:
    """A note for ``--half`` (or val's ``--fp32``) given with an export, whose precision was fixed when it was
    exported (Ultralytics ignores its ``half=True`` there without a word); None when the export already is what was
    asked, or nothing was asked."""
    precision = backend.info.precision
    if Path(weights).suffix.lower() == ".pt":  # converted at load as asked (TorchBackend)
        return None
    if (half and precision == "fp32") or (fp32 and precision != "fp32"):
        flag, other = ("--half", "--half") if half else ("--fp32", "no --half")
        return (f"note: {Path(weights).name} runs as exported ({precision}); {flag} applies to .pt weights (export "
                f"with {other} for the other precision)")
    return None


def find_latest_checkpoint(root: str | Path = "runs/train", name: str = "best.pt") -> Path | None:
    """The most recently modified ``<root>/*/weights/<name>``, or ``None`` when there is none."""
    return newest_file(root, f"*/weights/{name}")


def weights_or_latest(weights: str | Path | None) -> Path:
    """``--weights`` (a bare name found in the weights folder as training finds it:
    :func:`~detector.weights.locate.located`), or without one the newest training run's best.pt;
    ``FileNotFoundError`` when neither exists."""
    if weights is not None:
        from detector.weights.locate import located

        return located(weights)
    latest = find_latest_checkpoint()
    if latest is None:
        raise FileNotFoundError("no --weights given and no runs/train/*/weights/best.pt found")
    return latest
