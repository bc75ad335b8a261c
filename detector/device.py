"""Which device a command runs on: the one reading of every ``--device`` flag outside training's torchrun set-up."""

from __future__ import annotations

import torch


def resolve_device(request: str = "") -> torch.device:
    """``""`` -> ``cuda`` when a GPU is available, else ``cpu``; ``cpu``, ``cuda`` and ``cuda:N`` as asked.

    Raises ``ValueError`` (one line naming the flag) for any other value, and for CUDA on a machine without it.
    """
    request = request.strip()
    if not request:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not request.startswith(("cpu", "cuda")):
        raise ValueError(f"--device must be cpu, cuda or cuda:N (got {request!r})")
    try:
        device = torch.device(request)
    except RuntimeError:
        raise ValueError(f"--device must be cpu, cuda or cuda:N (got {request!r})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {request} was requested but no CUDA GPU is available")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {request} was requested but this machine has {torch.cuda.device_count()} "
                         f"CUDA GPU(s): cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device
