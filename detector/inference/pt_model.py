"""A ``.pt`` file as a model to run: one of our checkpoints, or Ultralytics YOLOv8 detection weights.

``val`` and ``predict`` take ``yolov8n.pt`` directly, as ``train --weights`` does: the file is read by the
safe reader of :mod:`detector.weights.ultralytics` (no code from it runs, ``ultralytics`` is never imported)
and copied into our model, whose layers are YOLOv8's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from detector.checkpoint import CheckpointError, model_from_checkpoint
from detector.model import YOLO, build_model


def model_from_pt(path: str | Path) -> tuple[YOLO, dict[str, Any]]:
    """-> (the model in eval mode, FP32, a checkpoint dict: ``"names"``, and ``"config"`` when the file has one).

    Ours first (EMA weights when present); a file that is not ours is tried as Ultralytics YOLOv8 weights.

    Raises:
        CheckpointError: neither; one line with both readers' reasons.
    """
    try:
        return model_from_checkpoint(path)
    except CheckpointError as ours:
        from detector.weights.ultralytics import load_pretrained, read_ultralytics_checkpoint

        try:
            foreign = read_ultralytics_checkpoint(path)
        except Exception as error:  # noqa: BLE001 - the reader's own one-line reasons (unsafe, not YOLOv8, ...)
            if not Path(path).is_file():
                raise ours from None
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise CheckpointError(f"{ours}; nor is it Ultralytics YOLOv8 weights ({reason})") from None
    model = build_model(num_classes=foreign.num_classes, scale=foreign.scale)
    load_pretrained(model, foreign)
    names = [foreign.names.get(index, str(index)) for index in range(foreign.num_classes)]
    print(f"{path}: Ultralytics YOLOv8{foreign.scale} weights ({foreign.num_classes} classes), read without "
          "running code from the file")
    return model.eval(), {"names": names, "source": "ultralytics"}
