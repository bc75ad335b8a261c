"""A ``.pt`` file as a model to run: one of our checkpoints, or Ultralytics YOLOv8, YOLO11 or YOLO26 detection weights.

``val`` and ``predict`` take ``yolov8n.pt`` and ``yolo11n.pt`` directly, as ``train --weights`` does: the file is read
by the safe reader of :mod:`detector.weights.ultralytics` (no code from it runs, ``ultralytics`` is never imported)
and copied into our model, whose layers are YOLOv8's or YOLO11's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from detector.architecture import display_name
from detector.checkpoint import CheckpointError, model_from_checkpoint
from detector.checkpoint_problems import BOTH_READERS, file_start, is_torch_file, not_a_checkpoint
from detector.model import YOLO, build_model

if TYPE_CHECKING:
    from detector.weights.ultralytics import UltralyticsCheckpoint

# How our reader's refusal of a file naming Ultralytics' classes starts (detector.checkpoint_problems.load_problem).
ULTRALYTICS_FILE = ": an Ultralytics checkpoint (it names ultralytics."


def read_foreign_weights(path: str | Path, ours: CheckpointError) -> UltralyticsCheckpoint:
    """``path`` read as Ultralytics YOLOv8, YOLO11 or YOLO26 weights once our reader refused it with ``ours`` (val,
    predict and ``train --weights`` alike).

    Raises:
        CheckpointError: one line: the file is no PyTorch checkpoint at all (said once, for both readers), or each
            reader's reason where they differ (ours first: it names a global the file would run).
    """
    if not Path(path).is_file():
        raise ours
    start = file_start(path)
    if start and not is_torch_file(start):  # not what torch.save writes: the other reader cannot read it either
        raise CheckpointError(f"{Path(path)}: {not_a_checkpoint(start, which=BOTH_READERS)}") from None
    from detector.weights.ultralytics import read_ultralytics_checkpoint

    try:
        return read_ultralytics_checkpoint(path)
    except Exception as error:  # noqa: BLE001 - the reader's own one-line reasons (unsafe, not YOLOv8/YOLO11/YOLO26, ...)
        prefix = f"{Path(path)}: "  # both messages start with the file's name: said once
        reason = (str(error).splitlines()[0] if str(error) else type(error).__name__).removeprefix(prefix)
        if reason == str(ours).removeprefix(prefix):  # the same bytes failed both the same way (damaged, empty)
            raise ours from None
        if ULTRALYTICS_FILE in str(ours):  # ours says "read with --weights": what was just tried, and failed
            raise CheckpointError(f"{prefix}an Ultralytics checkpoint, but {reason}") from None
        raise CheckpointError(f"{ours}; nor is it Ultralytics YOLOv8, YOLO11 or YOLO26 weights ({reason})") from None


def model_from_pt(path: str | Path) -> tuple[YOLO, dict[str, Any]]:
    """-> (the model in eval mode, FP32, a checkpoint dict: ``"names"``, and ``"config"`` when the file has one).

    Ours first (EMA weights when present); a file that is not ours is tried as Ultralytics YOLOv8, YOLO11 or YOLO26
    weights.

    Raises:
        CheckpointError: neither, in one line (:func:`read_foreign_weights`).
    """
    try:
        return model_from_checkpoint(path)
    except CheckpointError as ours:
        foreign = read_foreign_weights(path, ours)
    from detector.weights.ultralytics import load_pretrained

    model = build_model(num_classes=foreign.num_classes, scale=foreign.scale, class_channels=foreign.class_channels)
    load_pretrained(model, foreign)
    names = [foreign.names.get(index, str(index)) for index in range(foreign.num_classes)]
    print(f"{path}: Ultralytics {display_name(foreign.scale)} weights ({foreign.num_classes} classes), read without "
          "running code from the file")
    return model.eval(), {"names": names, "source": "ultralytics"}
