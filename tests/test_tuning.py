import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detector import tuning
from detector.tuning import (
    MAX_AUTOTUNED_SHAPES,
    MIN_STEPS_PER_AUTOTUNED_SHAPE,
    ONEDNN_CACHE_CAPACITY,
    ONEDNN_CACHE_ENV,
    autotune_convolutions,
    enlarge_onednn_cache,
    on_glibc,
    tune_process,
)
from detector.workflows import benchmark, predict, val
from detector.workflows.options import BenchmarkOptions, PredictOptions, ValOptions

SHOW = """
import os, sys
import torch
import detector, detector.cli, detector.training.trainer
from detector.tuning import tune_process
print(os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "unset"))
tune_process(torch.device(sys.argv[1]))
print(os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "unset"))
"""


def _cache_values(environment: dict[str, str], device: str = "cpu") -> list[str]:
    """The variable after importing detector, then after tune_process (in a fresh process)."""
    done = subprocess.run([sys.executable, "-c", SHOW, device], env=environment, capture_output=True, text=True,
                          check=True, timeout=120)
    return done.stdout.split()


def test_importing_detector_leaves_the_environment_alone_and_a_run_enlarges_the_onednn_kernel_cache():
    environment = {k: v for k, v in os.environ.items() if k != ONEDNN_CACHE_ENV}
    assert _cache_values(environment) == ["unset", str(ONEDNN_CACHE_CAPACITY)]


def test_a_users_own_cache_size_is_kept(monkeypatch):
    # In this process: what is checked is the value left for oneDNN, not when oneDNN reads it (the test above).
    # enlarge_onednn_cache is the part of tune_process that sets it; the rest (malloc) would stay changed.
    monkeypatch.setenv(ONEDNN_CACHE_ENV, "77")
    enlarge_onednn_cache()
    assert os.environ[ONEDNN_CACHE_ENV] == "77"


# One fresh process measures both: glibc's defaults first, then the same allocations after hold_freed_memory
# (mallopt changes only what happens from then on, so the order keeps the first measurement clean).
FAULTS = """
import resource
import torch
from detector.tuning import hold_freed_memory
def touch_and_free():
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB: above glibc's largest mmap threshold
    del block
def faults():
    for _ in range(10):  # the heap settles first: early holes are too small for the next block until they merge
        touch_and_free()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        touch_and_free()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
default = faults()
applied = hold_freed_memory()
print(default, applied, faults())
"""


@pytest.mark.skipif(not on_glibc(), reason="glibc only")
def test_held_memory_is_reused_without_new_page_faults():
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    done = subprocess.run([sys.executable, "-c", FAULTS], env=environment, capture_output=True, text=True,
                          check=True, timeout=120)
    default, applied, held = done.stdout.split()
    pages = 4 * (64 << 20) // resource.getpagesize()
    assert applied == "True"
    assert int(held) < pages // 20
    # Without it, every 64 MiB block is mapped afresh and faulted in page by page: the check above can fail.
    assert int(default) > pages // 2


def test_the_process_holds_freed_memory_on_the_cpu_only(monkeypatch):
    held: list[bool] = []
    monkeypatch.setattr(tuning, "hold_freed_memory", lambda: held.append(True) or True)
    monkeypatch.setattr(tuning, "enlarge_onednn_cache", lambda: None)  # this process's environment stays as it is
    tune_process(torch.device("cuda"))  # a device object only: nothing runs on it
    assert held == []
    tune_process(torch.device("cpu"))
    assert held == [True]


class Tuned(Exception):
    """Raised by the stand-in for tune_process: the command got that far and no further."""


@pytest.mark.parametrize("module,run,options", [
    (val, val.run_val, ValOptions(weights=Path("missing.pt"), data=Path("missing.yaml"), device="cpu")),
    (predict, predict.run_predict, PredictOptions(weights=Path("missing.pt"), source="missing.jpg", device="cpu")),
    (benchmark, benchmark.run_benchmark, BenchmarkOptions(weights=Path("missing.pt"), device="cpu")),
], ids=["val", "predict", "benchmark"])
def test_inference_commands_tune_the_process_before_anything_else(module, run, options, monkeypatch):
    # Before its first convolution, and here before it even reads its files: they do not exist.
    seen: list[torch.device] = []

    def tune(device: torch.device) -> None:
        seen.append(device)
        raise Tuned

    monkeypatch.setattr(module, "tune_process", tune)
    with pytest.raises(Tuned):
        run(options)
    assert seen == [torch.device("cpu")]


def test_cuda_autotunes_only_where_the_timing_can_pay_back(monkeypatch):
    # Setting the flag needs no GPU; monkeypatch restores it for the other tests.
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    cuda = torch.device("cuda")
    tune_process(cuda)
    assert torch.backends.cudnn.benchmark is False  # decided once the shapes are known
    enough = MIN_STEPS_PER_AUTOTUNED_SHAPE * MAX_AUTOTUNED_SHAPES
    assert autotune_convolutions(cuda, input_shapes=MAX_AUTOTUNED_SHAPES, steps=enough)
    assert torch.backends.cudnn.benchmark is True
    assert not autotune_convolutions(cuda, input_shapes=MAX_AUTOTUNED_SHAPES + 1, steps=10 * enough)
    assert torch.backends.cudnn.benchmark is False
    # BCCD at 640 px: 13 steps per epoch for 100 epochs, five multi-scale shapes (or one): too short to pay back.
    assert not autotune_convolutions(cuda, input_shapes=5, steps=1300)
    assert not autotune_convolutions(cuda, input_shapes=1, steps=1300)
    assert autotune_convolutions(cuda, input_shapes=5, steps=100 * 7300)  # COCO
    assert autotune_convolutions(cuda, input_shapes=20, steps=1, policy="on")  # the switch wins
    assert not autotune_convolutions(cuda, input_shapes=1, steps=10**7, policy="off")
    assert not autotune_convolutions(torch.device("cpu"), input_shapes=1, steps=10**7, policy="on")  # CPU: untouched
    assert torch.backends.cudnn.benchmark is False
    with pytest.raises(ValueError, match="--cudnn-benchmark"):
        autotune_convolutions(cuda, input_shapes=1, steps=1, policy="always")


def test_validation_over_many_shapes_uses_heuristics_and_restores_the_setting(monkeypatch):
    from detector.tuning import heuristics_over_many_shapes

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    cuda = torch.device("cuda")  # a device object only: nothing runs on it
    for device, shapes, inside in ((cuda, MAX_AUTOTUNED_SHAPES + 1, False), (cuda, MAX_AUTOTUNED_SHAPES, True),
                                   (torch.device("cpu"), 100, True)):
        with heuristics_over_many_shapes(device, shapes):
            assert torch.backends.cudnn.benchmark is inside
        assert torch.backends.cudnn.benchmark is True
    with heuristics_over_many_shapes(cuda, MAX_AUTOTUNED_SHAPES + 1, "on"):  # forced on: left on
        assert torch.backends.cudnn.benchmark is True
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)  # a run that does not autotune: left off
    with heuristics_over_many_shapes(cuda, 1):
        assert torch.backends.cudnn.benchmark is False


def test_cudnn_heuristics_turns_autotuning_off_on_cuda_only_and_restores_it_after_an_error(monkeypatch):
    from detector.tuning import cudnn_heuristics

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    with pytest.raises(RuntimeError, match="inside"):
        with cudnn_heuristics(torch.device("cuda")):  # a device object only: nothing runs on it
            assert torch.backends.cudnn.benchmark is False
            raise RuntimeError("inside")
    assert torch.backends.cudnn.benchmark is True
    for device, when in ((torch.device("cpu"), True), (torch.device("cuda"), False)):
        with cudnn_heuristics(device, when=when):
            assert torch.backends.cudnn.benchmark is True
