"""torch.distributed for torchrun: set-up, and the one place where ranks agree on a decision.

Every decision that changes what a rank computes (precision after the AMP check or a fallback, stopping
on Ctrl-C, a time budget or early stopping, an error that ends the run) is taken once and applied by all
ranks: a rank that decided alone would average gradients of another precision with the others, or wait
at a collective the others never reach.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import os
import pickle
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from detector.device import resolve_device
from detector.precision import Precision, safest


# How long a rank waits at a collective. Rank 0 works alone while the others wait: it prepares the node's data
# first (a COCO-sized first scan and cache), and validates, reports and checkpoints after every epoch. NCCL's
# default of 10 minutes would end the whole job there; 3 hours is Ultralytics' value for the same reason.
PROCESS_GROUP_TIMEOUT = timedelta(hours=3)


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1  # processes on this node (they share its cores)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


class DistributedSetupError(RuntimeError):
    """A torchrun launch that cannot work on this machine; the message says what to change."""


def gpu_shortage(local_world_size: int, visible_gpus: int) -> str | None:
    """Why ``local_world_size`` processes cannot each have their own CUDA device here (None: they can).

    NCCL, the CUDA backend, needs one GPU per process: two ranks on one GPU fail at their first collective
    ("Duplicate GPU detected") or wait there until the timeout. gloo on the CPU has no such limit.
    """
    if local_world_size <= visible_gpus:
        return None
    return (f"torchrun started {local_world_size} processes on this node but {visible_gpus} GPU"
            f"{'' if visible_gpus == 1 else 's'} {'is' if visible_gpus == 1 else 'are'} visible, and CUDA training "
            f"needs one GPU per process: use --nproc_per_node {max(visible_gpus, 1)}, or --device cpu (gloo)")


def init_distributed(device_request: str) -> tuple[DistInfo, torch.device]:
    """Join the process group when launched by torchrun; pick this process's device.

    Raises :class:`DistributedSetupError` on each node's local rank 0 (one line) and exits the others quietly (code 1) when a
    CUDA run has more processes on this node than visible GPUs, before any collective could wait on them.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_request)
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if device.type == "cuda" and world_size > 1:
        problem = gpu_shortage(local_world_size, torch.cuda.device_count())
        if problem is not None:
            if local_rank == 0:
                raise DistributedSetupError(problem)
            raise SystemExit(1)  # the node's first process says why: one line, not one per process
    if device.type == "cuda":
        # Under torchrun each process takes the GPU of its local rank, whatever index was asked for: said once.
        if world_size > 1 and local_rank == 0 and device.index not in (None, 0):
            warnings.warn(f"--device {device}: under torchrun each process takes the GPU of its local rank "
                          f"(cuda:0 to cuda:{local_world_size - 1}); choose the GPUs with CUDA_VISIBLE_DEVICES")
        device = torch.device("cuda", local_rank if world_size > 1 else (device.index or 0))
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        # Bound to this process's GPU: NCCL's first barrier otherwise guesses it as global rank mod GPUs per node,
        # another GPU than set_device's wherever a node runs fewer processes than it has GPUs (two nodes of two
        # processes on 4-GPU machines: rank 2 took cuda:2 for the barrier and cuda:0 for the rest), and hangs.
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", timeout=PROCESS_GROUP_TIMEOUT,
                                device_id=device if device.type == "cuda" else None)
        # The group stays for the process's next run (train() twice under torchrun) and ends at its exit. One
        # destroyed after each run and made anew hung 3 launches in 5: the new default group takes the old one's
        # name on torchrun's store, whose keys still held the old group's addresses, so one rank joined the old
        # group's dead endpoints while the other waited for it in the new one.
        atexit.register(end_group)
    return DistInfo(rank, local_rank, world_size, local_world_size), device


EXIT_WAIT = timedelta(seconds=60)  # at exit, how long a rank waits for the others before leaving the group as it is


def end_group() -> None:
    """At exit: the process group :func:`init_distributed` started, if it still runs. A gloo group is destroyed once
    every rank has come this far (one rank's destruction while another still used the group aborted that one, 1
    launch in 9); a rank that never comes (it died) leaves the group to the process's end, after ``EXIT_WAIT``."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "gloo":
        try:
            dist.monitored_barrier(timeout=EXIT_WAIT)
        except RuntimeError:
            return
    dist.destroy_process_group()


T = TypeVar("T")


def broadcast_from_main(value: T, info: DistInfo) -> T:
    """Rank 0's ``value`` on every rank (any picklable object); the value itself in one process."""
    if not info.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def decide_on_main(decide: Callable[[], T], info: DistInfo) -> T:
    """Run ``decide()`` on rank 0 alone; its result, or the exception it raised, reaches every rank.

    Without this, an error on rank 0 (a diverged run, a full disk) would leave the others waiting at their
    next collective until the timeout.
    """
    outcome: tuple[bool, object] | None = None
    raised: Exception | None = None
    if info.is_main:
        try:
            outcome = (True, decide())
        except Exception as error:  # re-raised below, on every rank
            if not info.enabled:
                raise
            outcome, raised = (False, portable(error)), error
    outcome = broadcast_from_main(outcome, info)
    assert outcome is not None
    succeeded, value = outcome
    if raised is not None:
        raise raised  # rank 0: its own error, with its traceback
    if not succeeded:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]


def agreed_precision(precision: Precision, info: DistInfo) -> Precision:
    """The safest of every rank's ``precision`` (rank 0's on a tie); ``precision`` itself in one process.

    Each rank resolves its precision for its own GPU: ``--precision bf16`` gives FP32 on a GPU without native BF16,
    so a job over GPUs of two generations would train its ranks in different precisions.
    """
    if not info.enabled:
        return precision
    every: list[Precision] = [precision] * info.world_size  # each replaced by that rank's
    dist.all_gather_object(every, precision)
    return functools.reduce(safest, every)


def portable(error: Exception) -> Exception:
    """``error`` where it survives pickling, as the broadcast pickles it; else a RuntimeError of its type's name and
    message. An attribute that does not pickle, or an ``__init__`` of more arguments than the error's ``args``,
    failed the broadcast on rank 0 (its own error lost behind a pickling error) or the unpickling on the others."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - whatever pickling raises: the line still reaches every rank
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def any_rank(flag: bool, info: DistInfo) -> bool:
    """True on every rank when ``flag`` is true on at least one (e.g. one rank saw Ctrl-C)."""
    if not info.enabled:
        return flag
    tensor = torch.tensor([int(flag)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


@contextlib.contextmanager
def local_main_first(info: DistInfo) -> Iterator[None]:
    """Run the block on each node's local rank 0 first, then on the other ranks of the node.

    For one-time preparation (generating the built-in dataset, verifying images, writing caches): the
    first process does the work, the others wait and then find it done. Nodes prepare in parallel.
    """
    if info.enabled and info.local_rank != 0:
        dist.barrier()
    try:
        yield
    finally:
        if info.enabled and info.local_rank == 0:
            dist.barrier()


@contextlib.contextmanager
def group_ended_on_error() -> Iterator[None]:
    """Around a run's set-up: a gloo process group the block started is destroyed when the block raises, so a
    Python caller's process is left without it and torch's warning at exit (a run that trains keeps its group for
    the process's next run: :func:`init_distributed`). A group that was running before is the caller's. An NCCL group is
    left as it is: its destruction is a collective that waits for the other ranks, which may be waiting in one of
    their own for this one (the AMP check's verdict, a barrier), and the job would hang for hours instead of
    ending when this process exits (torchrun then stops the others)."""
    running = dist.is_available() and dist.is_initialized()
    try:
        yield
    except BaseException:
        if not running and dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
            dist.destroy_process_group()
        raise


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside DistributedDataParallel (or the model itself)."""
    return model.module if hasattr(model, "module") and isinstance(model, nn.parallel.DistributedDataParallel) else model


def gradients_reduced(model: nn.Module, reduce: bool) -> contextlib.AbstractContextManager:
    """Around a micro-step's forward and backward: DDP's ``no_sync()`` when ``reduce`` is False, so a step that ends
    without the optimizer keeps its gradients local and the micro-steps' sum is reduced once, with the backward of
    the step that ends with it (the same gradients: a sum reduced once, not each part). Without it every
    micro-step reduced every gradient: half the all-reduces wasted at 2 processes of batch 16 and a nominal 64.
    Not DDP: nothing to keep local."""
    if not reduce and isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def without_sync_batchnorm(model: nn.Module) -> nn.Module:
    """``model`` itself, or, where it holds SyncBatchNorm layers (``--sync-bn``), a copy with plain BatchNorm2d ones
    of the same weights and statistics: for a training-mode forward pass that one rank runs alone (the AMP check),
    where a SyncBatchNorm would start a collective the other ranks never join, and the job would hang."""
    if not any(isinstance(module, nn.SyncBatchNorm) for module in model.modules()):
        return model
    copied = copy.deepcopy(model)
    for parent in list(copied.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.SyncBatchNorm):
                state = child.state_dict()
                device = next((tensor.device for tensor in state.values()), None)
                plain = nn.BatchNorm2d(child.num_features, child.eps, child.momentum, child.affine,
                                       child.track_running_stats, device=device)
                plain.load_state_dict(state)
                setattr(parent, name, plain.train(child.training))
    return copied
