"""Which device a command runs on: the one reading of every ``--device`` flag outside training's torchrun set-up."""

from __future__ import annotations

import torch

UNKNOWN = "--device must be cpu, cuda, cuda:N or N (got {!r}); this trainer runs on CPUs and CUDA GPUs only"
SEVERAL = ("--device {}: one device per process here; for several GPUs launch with torchrun --nproc_per_node N "
           "(docs/distributed.md)")


def resolve_device(request: str = "") -> torch.device:
    """``""`` -> ``cuda`` when a GPU is available, else ``cpu``; ``cpu``, ``cuda`` and ``cuda:N`` as asked.

    Ultralytics' spellings read as there (its users type them, and ``device=0`` already meant ``cuda:0`` through
    :mod:`detector.aliases` while ``--device 0`` was refused): any case (``CPU``), a bare index (``0`` is
    ``cuda:0``), and ``-1`` (its "most idle GPU, else the CPU") as ``""``.

    Raises ``ValueError`` (one line naming the flag) for any other value, and for CUDA on a machine without it.
    """
    request = request.strip()
    if request == "-1":
        request = ""
    if not request:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if "," in request:  # Ultralytics' multi-GPU form: one clear way to it here
        raise ValueError(SEVERAL.format(request))
    spelled = f"cuda:{int(request)}" if request.isdigit() else request.lower()
    if not spelled.startswith(("cpu", "cuda")):
        raise ValueError(UNKNOWN.format(request))
    try:
        device = torch.device(spelled)
    except RuntimeError:
        raise ValueError(UNKNOWN.format(request)) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {request} was requested but no CUDA GPU is available")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {request} was requested but this machine has {torch.cuda.device_count()} "
                         f"CUDA GPU(s): cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device
