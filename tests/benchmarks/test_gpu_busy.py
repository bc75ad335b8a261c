"""The GPU-busy sampler's arithmetic, driven by fake readings and a fake clock: it tests our averaging, not NVML."""

import time

import pytest

from benchmarks.gpu_busy import BusySampler, busy_text, sampler_for
from tests.conftest import FakeClock


def test_readings_are_weighted_by_the_time_they_stand_for():
    clock, readings = FakeClock(), iter([50.0, 100.0, 0.0])
    sampler = BusySampler(lambda: next(readings), clock=clock)
    sampler.begin()
    for at in (1.0, 3.0, 4.0):  # the second reading came late: it stands for two seconds
        clock.now = at
        sampler.sample()
    assert sampler.share() == pytest.approx((50 * 1 + 100 * 2 + 0 * 1) / 4 / 100)  # 62.5%, not the plain mean 50%


def test_no_time_no_share_and_the_printed_forms():
    clock = FakeClock()
    sampler = BusySampler(lambda: 100.0, clock=clock)
    sampler.begin()
    assert sampler.share() is None
    assert busy_text(None) == "GPU busy: n/a"
    assert busy_text(0.734) == "GPU busy: 73%"


def test_the_background_thread_samples_until_stopped():
    calls = []

    def read() -> float:
        calls.append(time.perf_counter())
        return 40.0

    sampler = BusySampler(read, interval=0.01).start()
    time.sleep(0.1)
    share = sampler.stop()
    count = len(calls)
    time.sleep(0.05)
    assert share == pytest.approx(0.4)  # a constant reading averages to itself whatever the weights
    assert count >= 3 and len(calls) == count  # sampled in the background, and not after stop()


def test_no_sampler_on_the_cpu():
    assert sampler_for("cpu") is None


def test_a_reading_that_fails_gives_no_share_instead_of_stopping_the_benchmark():
    """A MIG slice answers NOT_SUPPORTED: the sampler's thread must not die, nor stop() raise after a run."""
    clock = FakeClock()

    def read() -> float:
        raise RuntimeError("NVML: Not Supported")

    sampler = BusySampler(read, clock=clock)
    sampler.begin()
    clock.now = 1.0
    assert sampler.stop() is None and sampler.failed


class FakeNVML:
    """The few pynvml calls the sampler makes, over a machine of four GPUs named by index and UUID."""

    class NVMLError(Exception):
        pass

    def __init__(self, supported: bool = True) -> None:
        self.supported = supported

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"nvml{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return f"nvml-{uuid}"

    def nvmlDeviceGetUtilizationRates(self, handle: str):
        if not self.supported:
            raise self.NVMLError("Not Supported")
        return type("Utilization", (), {"gpu": {"nvml0": 10, "nvml1": 11, "nvml3": 13}.get(handle, 99)})()


def test_cuda_devices_are_found_in_nvml_through_cuda_visible_devices(monkeypatch):
    import sys

    from benchmarks.gpu_busy import nvml_reading

    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvml_reading(1)() == 11.0  # all GPUs visible: the same numbers
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,0")
    assert nvml_reading(0)() == 13.0 and nvml_reading(1)() == 10.0  # cuda:0 is the machine's GPU 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8a2f")
    assert nvml_reading(0)() == 99.0  # by UUID
    assert nvml_reading(1) is None  # not visible to CUDA
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(supported=False))
    assert nvml_reading(0) is None  # no reading: n/a, not a crash later
