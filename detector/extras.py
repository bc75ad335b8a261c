"""Optional dependencies: imported where they are used, and one line naming the extra that installs them.

The distribution is ``detector-yolo`` on the package index (the name ``detector`` belongs to another
project there); the import package and the command are ``detector``. Its extras (pyproject.toml):

* ``export``: onnx, onnxruntime, onnxslim (ONNX export, ONNX inference, ``--simplify``);
* ``tensorboard``: tensorboard (``--tensorboard``);
* ``dev``: both, plus the test and benchmark tools.

What no extra installs (TensorRT and a CUDA GPU, a C++ compiler for pt2 export) is :class:`Unavailable`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

DISTRIBUTION = "detector-yolo"


def install_hint(extra: str) -> str:
    """``pip install 'detector-yolo[export]'``: the command that installs ``extra``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


class MissingExtra(ImportError):
    """An optional package is not installed; the message names the extra that brings it (one line)."""


class Unavailable(RuntimeError):
    """Something this machine lacks and no extra installs (TensorRT with a CUDA GPU, a C++ compiler): one line
    that names it."""


def require(module: str, extra: str, purpose: str, *, package: str = "") -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtra`: ``"ONNX export needs the 'onnx' package: pip install ..."``.

    ``purpose`` says what needed it (``"ONNX export"``); ``package`` is the missing distribution when it is not
    the module's top-level name (``torch.utils.tensorboard`` fails without ``tensorboard``).
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        missing = package or module.split(".")[0]
        raise MissingExtra(f"{purpose} needs the '{missing}' package: {install_hint(extra)}") from None
