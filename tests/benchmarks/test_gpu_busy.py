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
