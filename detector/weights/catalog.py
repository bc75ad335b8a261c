"""The pretrained checkpoints ``python -m detector download yolov8n`` can fetch: Ultralytics' YOLOv8 detection files.

No network code here (:mod:`detector.weights.download` fetches); this module only names the files, so
``--weights yolov8n.pt`` that finds nothing can say which command fetches it.

Ultralytics publishes no checksums for these files. The sizes are the byte counts of the v8.4.0 release
assets; ``yolov8n.pt`` and ``yolov8s.pt`` match the sizes other projects quote, those of ``m``, ``l`` and ``x``
could not be checked against a second source. A download is checked against its size and then read
through the restricted unpickler (:mod:`detector.weights.safe_pickle`), which proves it is a YOLOv8
detection checkpoint of the expected scale.
"""

from __future__ import annotations

from dataclasses import dataclass

ULTRALYTICS_RELEASE = "https://github.com/ultralytics/assets/releases/download/v8.4.0"
LICENCE_NOTE = (
    "Ultralytics' YOLOv8 weights are licensed AGPL-3.0 (https://ultralytics.com/license), not Apache-2.0 like "
    "detector; models fine-tuned from them may carry AGPL-3.0 obligations. detector never imports Ultralytics "
    "code: it reads the file's tensors only."
)


@dataclass(frozen=True)
class PretrainedWeights:
    name: str  # what ``python -m detector download NAME`` takes: "yolov8n"
    scale: str  # our model scale the file maps onto
    size: int  # bytes, exact
    source: str = ULTRALYTICS_RELEASE

    @property
    def filename(self) -> str:
        return f"{self.name}.pt"

    @property
    def url(self) -> str:
        return f"{self.source}/{self.filename}"


PRETRAINED = {
    weights.name: weights
    for weights in (
        PretrainedWeights("yolov8n", "n", 6_549_796),
        PretrainedWeights("yolov8s", "s", 22_588_772),
        PretrainedWeights("yolov8m", "m", 52_136_884),
        PretrainedWeights("yolov8l", "l", 87_792_836),
        PretrainedWeights("yolov8x", "x", 136_890_692),
    )
}


def pretrained_name(text: str) -> str | None:
    """``"yolov8n"``, ``"YOLOv8n.pt"`` -> ``"yolov8n"``; None when ``text`` names no catalogued file."""
    name = text.strip().lower().removesuffix(".pt")
    return name if name in PRETRAINED else None
