"""torch.distributed set-up for torchrun: rank/world from the environment, gloo on CPU, NCCL on GPU."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_request: str) -> tuple[DistInfo, torch.device]:
    """Join the process group when launched by torchrun; pick this process's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    wants_cuda = device_request.startswith("cuda") or (not device_request and torch.cuda.is_available())
    if device_request and not device_request.startswith(("cpu", "cuda")):
        raise ValueError(f"--device must be cpu, cuda or cuda:N (got {device_request!r})")
    if wants_cuda and not torch.cuda.is_available():
        raise ValueError("--device cuda was requested but no CUDA GPU is available")
    if wants_cuda:
        index = local_rank if world_size > 1 else (int(device_request.split(":")[1]) if ":" in device_request else 0)
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistInfo(rank, local_rank, world_size), device


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
