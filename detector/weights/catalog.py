"""The pretrained checkpoints ``python -m detector download yolov8n`` can fetch: Ultralytics' YOLOv8 detection files.

No network code here (:mod:`detector.weights.download` fetches); this module only names the files, so
``--weights yolov8n.pt`` that finds nothing can say which command fetches it.

Every file is pinned by its exact size and SHA-256. Ultralytics publishes no checksums with its GitHub
release assets (``ultralytics/assets``), and none of those assets' digests could be found from here; the
files are therefore fetched from Ultralytics' own Hugging Face repository ``Ultralytics/YOLOv8`` at commit
``8a9e1a55f987a77f9966c2ac3f80aa8aa37b3c1a`` ("Upload 5 files", by glenn-jocher), whose Git LFS pointers
give each file's SHA-256 and size: the URL names that commit, so the bytes behind it cannot change, and a
download whose digest differs is deleted. The same SHA-256 and size for yolov8n.pt appear in several
unrelated repositories that copied the file Ultralytics' own package downloads (e.g. the Hugging Face Space
``nagasurendra/surveillance``), which ties these files to the released YOLOv8 weights. After the digest, the
file is read through the restricted unpickler (:mod:`detector.weights.safe_pickle`), which proves it is a
YOLOv8 detection checkpoint of the expected scale.
"""

from __future__ import annotations

from dataclasses import dataclass

# Ultralytics' Hugging Face repository at one commit (see the module docstring for why not the GitHub release).
ULTRALYTICS_RELEASE = "https://huggingface.co/Ultralytics/YOLOv8/resolve/8a9e1a55f987a77f9966c2ac3f80aa8aa37b3c1a"
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
    sha256: str  # of the whole file: the Git LFS object id at ULTRALYTICS_RELEASE's commit
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
        PretrainedWeights("yolov8n", "n", 6_534_387, "31e20dde3def09e2cf938c7be6fe23d9150bbbe503982af13345706515f2ef95"),
        PretrainedWeights("yolov8s", "s", 22_573_363, "268e5bb54c640c96c3510224833bc2eeacab4135c6deb41502156e39986b562d"),
        PretrainedWeights("yolov8m", "m", 52_117_635, "6c25b0b63b1a433843f06d821a9ac1deb8d5805f74f0f38772c7308c5adc55a5"),
        PretrainedWeights("yolov8l", "l", 87_769_683, "18218ea4798da042d9862e6029ca9531adbd40ace19b6c9a75e2e28f1adf30cc"),
        PretrainedWeights("yolov8x", "x", 136_867_539, "c4d5a3f000d771762f03fc8b57ebd0aae324aeaefdd6e68492a9c4470f2d1e8b"),
    )
}


def pretrained_name(text: str) -> str | None:
    """``"yolov8n"``, ``"YOLOv8n.pt"`` -> ``"yolov8n"``; None when ``text`` names no catalogued file."""
    name = text.strip().lower().removesuffix(".pt")
    return name if name in PRETRAINED else None
