"""Optional TensorBoard logging: scalars and saved PNG figures, behind a lazy import.

TensorBoard is an optional extra (``pip install 'detector-yolo[tensorboard]'``), so nothing imports it until a
:class:`TensorBoardLogger` is created.
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from types import TracebackType

import cv2

from detector.extras import MissingExtra, install_hint

INSTALL_HINT = f"TensorBoard logging needs the 'tensorboard' package: {install_hint('tensorboard')}"


class TensorBoardUnavailable(MissingExtra):
    """Raised by :class:`TensorBoardLogger` when the tensorboard package is missing."""


class TensorBoardLogger:
    """Thin wrapper over ``torch.utils.tensorboard.SummaryWriter`` writing event files into ``log_dir``.

    Use as a context manager or call :meth:`close`. ``tensorboard --logdir runs/train`` shows the runs.
    ``purge_step``: TensorBoard hides the events that earlier event files in ``log_dir`` hold at this step and after
    (a resumed run's: the killed process logged epochs that this one trains and logs again).
    """

    def __init__(self, log_dir: str | Path, *, purge_step: int | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch raises ImportError (or ModuleNotFoundError) when tensorboard is absent
            raise TensorBoardUnavailable(INSTALL_HINT) from None
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    def scalars(self, values: dict[str, float | None], step: int) -> None:
        """Log each finite number under its own tag (``train/box``, ``mAP50``...); empty or NaN values
        (an epoch without evaluation) are skipped rather than logged as gaps or zeros."""
        for tag, value in values.items():
            if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
                self._writer.add_scalar(tag, float(value), step)

    def image(self, tag: str, png_path: str | Path, step: int) -> None:
        """Log a PNG written by :mod:`detector.plots` (read back with OpenCV, sent as RGB HWC)."""
        image = cv2.imread(str(png_path), cv2.IMREAD_COLOR)
        if image is None:
            raise FileNotFoundError(f"{png_path}: cannot read image for TensorBoard")
        self._writer.add_image(tag, cv2.cvtColor(image, cv2.COLOR_BGR2RGB), step, dataformats="HWC")

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
