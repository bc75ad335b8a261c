"""The share of time the GPU was busy during a timed region, sampled through NVML in a background thread.

NVML's ``utilization.gpu`` (what ``nvidia-smi`` shows) is the percentage of its last sample period (1/6 s to
1 s, by product) in which at least one kernel ran. :class:`BusySampler` reads it every ``interval`` seconds
between ``start()`` and ``stop()`` and weights each reading by the time since the previous one, so a reading
that the thread took late (the GIL, a busy host) counts for the time it stands for, not for one sample.

NVML comes from the ``bench`` extra (``pip install -e .[bench]``: nvidia-ml-py, NVIDIA's own bindings);
without it, or without an NVIDIA GPU, the benchmarks print ``GPU busy: n/a``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

Reading = Callable[[], float]  # the GPU's busy percentage now, 0-100


def nvml_reading(device_index: int = 0) -> Reading | None:
    """A function that reads the utilisation of CUDA device ``device_index`` through NVML; None without NVML, a GPU
    or a reading (a MIG slice and some virtual GPUs answer NOT_SUPPORTED: one read is tried here)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = nvml_handle(pynvml, device_index)

        def read() -> float:
            return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)

        read()
    except (pynvml.NVMLError, IndexError, ValueError):
        return None
    return read


def nvml_handle(pynvml, cuda_index: int):
    """NVML's handle of CUDA device ``cuda_index``. NVML numbers every GPU of the machine; CUDA only those that
    ``CUDA_VISIBLE_DEVICES`` lists, in its order, by index or by UUID."""
    visible = [entry.strip() for entry in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    if not visible:
        return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)
    entry = visible[cuda_index]
    if entry.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(entry))
    return pynvml.nvmlDeviceGetHandleByUUID(entry)


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
        self.failed = False  # a reading raised: no share is given, rather than one of part of the time

    def sample(self) -> None:
        """Take one reading; it stands for the time since the previous one (or since ``start``)."""
        try:
            value = self.read()
        except Exception:  # noqa: BLE001 - NVML's errors, whatever the driver: the benchmark goes on without it
            self.failed = True
            return
        now = self.clock()
        self.weighted += value * (now - self._last)
        self.seconds += now - self._last
        self._last = now

    def begin(self) -> None:
        """Start the clock without a thread (``start`` does this and then samples in the background)."""
        self.weighted = self.seconds = 0.0
        self.failed = False
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
        return self.weighted / self.seconds / 100 if self.seconds > 0 and not self.failed else None


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
