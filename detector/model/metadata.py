"""What an exported model says about itself: class names, strides, input size, precision, NMS.

ONNX files keep it in ``metadata_props`` and TensorRT engines in a JSON header (see
:mod:`detector.exporting.tensorrt`); both store the same keys, each value JSON-encoded as a string::

    names      ["person", ...]        class index -> name
    stride     32                     input height and width must be multiples of this
    strides    [8, 16, 32]            one per head level, anchors in this order
    imgsz      640                    square input size the graph was traced at (the only size unless dynamic)
    batch      1                      batch size traced (the largest TensorRT profile batch when dynamic)
    dynamic    false                  batch, height and width are free dimensions
    batch_free false                  pt2 packages only: the batch is free (export --dynamic), height and width
                                      fixed; false: every call runs ``batch`` images. A package without the key
                                      is free (pt2 exports before it); other formats never write it
    precision  "fp32" | "fp16"        fp16 = FP16 convolutions inside; inputs and outputs are always FP32
    nms        false                  true: outputs are detections [B, K, 6] + num_detections [B]
    nms_config {"conf_threshold": ...} the NMS thresholds baked into the graph (null without NMS); with
                                      end_to_end, the top-k's (its "end_to_end" true, no suppression)
    end_to_end false                  true: the outputs are a YOLO26 one-to-one head's (export --end-to-end), to be
                                      postprocessed by the NMS-free top-k (detector/topk.py), never NMS; a file
                                      without the key is false (exports before the key; YOLOv8, YOLO11)
    outputs    ["boxes", "scores"]    output names in order
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from detector.postprocess import NMSConfig

HOW_TO_EXPORT = "`detector export` (`python export.py` in a checkout)"  # an installed package has no export.py

INPUT_NAME = "images"  # float32 [B, 3, H, W], RGB in [0, 1], letterboxed


@dataclass(frozen=True)
class ModelInfo:
    """Decoded metadata of an exported model (see the module docstring for each field)."""

    names: list[str]
    strides: tuple[int, ...]
    imgsz: int
    batch: int = 1
    dynamic: bool = False
    precision: str = "fp32"
    nms: NMSConfig | None = None
    end_to_end: bool = False
    batch_free: bool | None = None  # pt2 only (None elsewhere): a free batch at a fixed height and width

    @property
    def stride(self) -> int:
        return max(self.strides)

    @property
    def outputs(self) -> list[str]:
        return ["detections", "num_detections"] if self.nms else ["boxes", "scores"]


def encode_metadata(info: ModelInfo) -> dict[str, str]:
    """-> string key/values for ONNX ``metadata_props`` or the engine header."""
    values: dict[str, Any] = {
        "names": info.names,
        "stride": info.stride,
        "strides": list(info.strides),
        "imgsz": info.imgsz,
        "batch": info.batch,
        "dynamic": info.dynamic,
        "precision": info.precision,
        "nms": info.nms is not None,
        "nms_config": dataclasses.asdict(info.nms) if info.nms else None,
        "outputs": info.outputs,
        "end_to_end": info.end_to_end,
    }
    if info.batch_free is not None:  # a pt2 package's; the other formats' metadata stays as it was
        values["batch_free"] = info.batch_free
    return {key: json.dumps(value) for key, value in values.items()}


def decode_metadata(props: dict[str, str], *, source: str = "<model>") -> ModelInfo:
    """Inverse of :func:`encode_metadata`; raises ``ValueError`` naming ``source`` when keys are missing."""
    try:
        values = {key: json.loads(value) for key, value in props.items()}
        nms = NMSConfig(**values["nms_config"]) if values.get("nms") else None
        if not isinstance(end_to_end := values.get("end_to_end", False), bool):  # "true" the text is no answer
            raise ValueError(f"end_to_end is {end_to_end!r}, not true or false")
        if not isinstance(batch_free := values.get("batch_free"), (bool, type(None))):
            raise ValueError(f"batch_free is {batch_free!r}, not true or false")
        return ModelInfo(
            names=list(values["names"]),
            strides=tuple(values["strides"]),
            imgsz=int(values["imgsz"]),
            batch=int(values.get("batch", 1)),
            dynamic=bool(values.get("dynamic", False)),
            precision=str(values.get("precision", "fp32")),
            nms=nms,
            end_to_end=end_to_end,
            batch_free=batch_free,
        )
    except (KeyError, TypeError, ValueError) as error:
        message = f"{source}: missing or malformed detector metadata ({error}); was it made by {HOW_TO_EXPORT}?"
        raise ValueError(message) from None
