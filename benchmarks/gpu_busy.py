"""The share of time the GPU was busy during a timed region, sampled through NVML in a background thread.

NVML's ``utilization.gpu`` (what ``nvidia-smi`` shows) is the percentage of its last sample period (1/6 s to
1 s, by product) in which at least one kernel ran. :class:`BusySampler` reads it every ``interval`` seconds
between ``start()`` and ``stop()`` and weights each reading by the time since the previous one, so a reading
that the thread took late (the GIL, a busy host) counts for the time it stands for, not for one sample.

NVML comes from the ``bench`` extra (``pip install -e .[bench]``: nvidia-ml-py, NVIDIA's own bindings);
without it, or without an NVIDIA GPU, the benchmarks print ``GPU busy: n/a``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

Reading = Callable[[], float]  # the GPU's busy percentage now, 0-100


def nvml_reading(device_index: int = 0) -> Reading | None:
    """A function that reads GPU ``device_index``'s utilisation through NVML; None without NVML or a GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
    except pynvml.NVMLError:
        return None
    return lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)


class BusySampler:
    """Time-weighted mean of ``read()`` over ``start()``..``stop()``, sampled in a daemon thread.

    ``clock`` and the thread's wait are injectable so that tests can drive the arithmetic without a GPU.
    """

    def __init__(self, read: Reading, *, interval: float = 0.1, clock: Callable[[], float] = time.perf_counter):
        self.read, self.interval, self.clock = read, interval, clock
        self.weighted = 0.0  # sum of reading x seconds it stands for
        self.seconds = 0.0
        self._last = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """Take one reading; it stands for the time since the previous one (or since ``start``)."""
        value = self.read()
        now = self.clock()
        self.weighted += value * (now - self._last)
        self.seconds += now - self._last
        self._last = now

    def begin(self) -> None:
        """Start the clock without a thread (``start`` does this and then samples in the background)."""
        self.weighted = self.seconds = 0.0
        self._last = self.clock()

    def start(self) -> BusySampler:
        self.begin()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-busy", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> float | None:
        """End sampling (one last reading covers the tail); -> the busy share in [0, 1], None if no time passed."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self.sample()
        return self.share()

    def share(self) -> float | None:
        return self.weighted / self.seconds / 100 if self.seconds > 0 else None


def busy_text(share: float | None) -> str:
    """``GPU busy: 73%``, or ``GPU busy: n/a`` where nothing was measured (the CPU, no NVML)."""
    return "GPU busy: n/a" if share is None else f"GPU busy: {100 * share:.0f}%"


def sampler_for(device: str) -> BusySampler | None:
    """A sampler of the GPU behind ``device`` (``cuda``, ``cuda:N``); None on the CPU or without NVML."""
    if not device.startswith("cuda"):
        return None
    index = int(device.partition(":")[2] or 0)
    read = nvml_reading(index)
    return BusySampler(read) if read is not None else None
