"""AOTInductor backend for ``.pt2`` packages written by :func:`detector.exporting.pt2.export_pt2`.

The package is native code plus weights; loading it needs torch but neither a compiler nor the model's
Python code. Height and width are fixed; so is the batch (``--batch``, fed in calls of that many, as a fixed
ONNX graph is), unless the package was exported with ``--dynamic``, whose any batch runs in one call.

On CUDA the package's run (and the uint8 input's scaling before it) is replayed from a CUDA graph, one per batch
size, captured on first use (:class:`~detector.inference.cuda_graph.CudaGraphRunner`), as the PyTorch backend's
forward is: at batch 1 a nano model's kernels are too short to keep the GPU busy between launches, and the
package's C++ runner launches each one from the host. A capture that fails says so once and the package runs as
compiled. The package is loaded without its runner's thread synchronisation (``run_single_threaded``, whose waits
a capture may not hold); a backend is called from one thread at a time.

Loading unpacks the package (the compiled ``.so`` with its weights, about the package's size) into a temporary
folder that AOTInductor's loader removes only in its destructor; on CUDA each kernel's ``.cubin`` is read from it on
the kernel's first launch, so the folder must outlive the load. Each load unpacks inside a ``detector-pt2-*`` folder
of ours in the temp dir (torch 2.14; torch 2.11 picks ``/tmp/XXXXXX`` itself), and :meth:`Pt2Backend.close`, the
backend's collection or the process's exit releases the loader and removes both. (The commands end with
``os._exit``, detector/cli/__init__.py, skipping the teardown that would destroy a loader still held: hence a hook.)
A killed process (SIGKILL, or SIGTERM, which Python leaves fatal) keeps its folder: ``detector-pt2-*`` with
``aotinductor_*`` inside, or 2.11's ``/tmp/XXXXXX``, safe to delete when no process of ours is running.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import json
import logging
import os
import shutil
import tempfile
import threading
import weakref
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from detector.inference.backend import Backend, RawOutputs, outputs_label, read_model_info, run_in_fixed_batches
from detector.inference.cuda_graph import CudaGraphRunner, Outputs
from detector.inference.preprocess import model_input
from detector.model.metadata import ModelInfo
from detector.postprocess import NMSConfig

if TYPE_CHECKING:
    from torch.export.pt2_archive._package import AOTICompiledModel

AOTI_KEY_PREFIX = "AOTI_"  # AOTInductor's own entries beside ours in the package metadata (platform, ISA, device)
UNPACK_PREFIX = "detector-pt2-"  # our folder in the temp dir, holding what one load unpacked
_TMPDIR_LOCK = threading.Lock()  # TMPDIR is the process's: one load at a time points it at its own folder


@contextlib.contextmanager
def quiet_cpp_builder() -> Iterator[None]:
    """torch's C++ builder (``torch.utils.cpp_extension``, imported by the pt2 compile and by the package loader)
    logs "No CUDA runtime is found, using CUDA_HOME=..." on a CPU machine that has a CUDA toolkit folder: a
    warning about nothing a CPU export or load uses. Its errors still show; the level is restored after."""
    builder_log = logging.getLogger("torch.utils.cpp_extension")
    level = builder_log.level
    builder_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        builder_log.setLevel(level)


def load_unpacking_into(folder: str, path: str | Path, **options: Any) -> AOTICompiledModel:
    """``torch._inductor.aoti_load_package(path, **options)``, unpacking under ``folder`` where this torch allows.

    The loader takes no folder (torch 2.11 and 2.14 alike). torch 2.14's makes ``$TMPDIR/aotinductor_XXXXXX``
    (``c10::make_tempdir``), so TMPDIR names ``folder`` for the load; torch 2.11's makes ``/tmp/XXXXXX`` whatever
    TMPDIR says. An internal detail either way: where it does not hold, ``folder`` stays empty and the loader's
    destructor is what cleans up. Another thread reading TMPDIR during the load (the unzip and dlopen) sees ``folder``.
    """
    # torch 2.10's loader reads torch._inductor.codecache without importing it ("module 'torch._inductor' has no
    # attribute 'codecache'" in a process where nothing else had); 2.11 imports it itself. Importing it is harmless.
    import torch._inductor.codecache  # noqa: F401

    with _TMPDIR_LOCK:
        previous = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = folder
        try:
            with quiet_cpp_builder():
                return torch._inductor.aoti_load_package(str(path), **options)
        finally:
            if previous is None:
                del os.environ["TMPDIR"]
            else:
                os.environ["TMPDIR"] = previous


METADATA_SUFFIX = "_metadata.json"  # AOTInductor's copy of the compile's metadata, beside the .so in the package
METADATA_MAX_BYTES = 2**20  # ours is ~400 bytes: a larger member is not read


def packaged_metadata(path: str | Path) -> dict[str, str]:
    """Our export's metadata as the package's ``*_metadata.json`` holds it (without AOTInductor's own keys), read
    from the zip without loading anything; ``{}`` where there is none to read (``read_model_info`` then says so)."""
    with zipfile.ZipFile(path) as archive:
        members = [member for member in archive.infolist() if "/data/aotinductor/" in member.filename
                   and member.filename.endswith(METADATA_SUFFIX) and member.file_size <= METADATA_MAX_BYTES]
        for member in members:
            try:
                props = json.loads(archive.read(member))
            except (ValueError, zipfile.BadZipFile, OSError):
                continue
            if isinstance(props, dict):
                return {str(key): str(value) for key, value in props.items()
                        if not str(key).startswith(AOTI_KEY_PREFIX)}
    return {}


def release_unpacked(graphs: list[Any], loaded: list[Any], folder: str) -> None:
    """Drop the CUDA graphs (they launch the package's kernels), then the loader (``loaded`` holds the only
    reference: its destructor removes the folder it unpacked into), then ``folder`` with anything left in it: a load
    that failed half-way (torch 2.14 checks the device after unpacking, and a constructor that throws runs no
    destructor). Never raises: it runs from a finalizer and at exit, while the backend may still be alive."""
    graphs.clear()
    loaded.clear()
    shutil.rmtree(folder, ignore_errors=True)


class Pt2Backend(Backend):
    """``torch._inductor.aoti_load_package`` behind the :class:`Backend` interface.

    Args:
        path: the ``.pt2`` file.
        device: must be the kind of device the package was compiled for (``cpu`` or ``cuda[:N]``).
    """

    def __init__(self, path: str | Path, *, device: str = "cpu", nms: NMSConfig | None = None) -> None:
        self.device = torch.device(device)
        index = self.device.index if self.device.type == "cuda" and self.device.index is not None else -1
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such pt2 package")
        if not zipfile.is_zipfile(path):  # before torch, which logs a misleading "outdated pt2 file" warning first
            raise ValueError(f"{path}: not a loadable pt2 package (not a zip archive)")
        # Before the loader, which dlopens the package's .so (running its constructors): a package without our
        # export's metadata, a foreign or replaced one, is refused unloaded. A forged one passes (docs/security.md).
        read_model_info(packaged_metadata(path), source=str(path))
        # Without the runner's own thread synchronisation where it can go, which a CUDA graph's capture cannot hold
        # (torch's advice for CUDA graphs); an older torch's loader may lack the switch.
        options = ({"run_single_threaded": True} if self.device.type == "cuda" and "run_single_threaded"
                   in inspect.signature(torch._inductor.aoti_load_package).parameters else {})
        # Released by close(), by the backend's collection, or at exit; a failed removal stays silent. The graphs sit
        # in a list the release empties first: at exit the backend is still alive, its graphs with it otherwise.
        self._graphs: list[CudaGraphRunner] = []
        self._loaded: list[AOTICompiledModel] = []
        # Before the load: mkdtemp settles Python's own temp dir, which TMPDIR pointed here for the load cannot become.
        folder = tempfile.mkdtemp(prefix=UNPACK_PREFIX)
        self._release = weakref.finalize(self, release_unpacked, self._graphs, self._loaded, folder)
        # Registered now, after detector.cli's handler (whose os._exit skips the teardown), so it runs before it;
        # weakref.finalize's own atexit hook is registered by the first finalize in the process (``import torch``'s).
        atexit.register(self._release)
        try:
            info = self._load(path, folder, index, options)
            super().__init__(info, nms, source=str(path))  # refuses --end-to-end for a package without that head
        except BaseException:
            self.close()
            raise
        if self.device.type == "cuda":
            self._graphs.append(CudaGraphRunner(self.run))  # a graph per batch size: the height and width are fixed

    def _load(self, path: str | Path, folder: str, index: int, options: dict[str, bool]) -> ModelInfo:
        """Load the package (unpacked under ``folder``) into ``self._loaded``; -> its metadata."""
        try:
            self._loaded.append(load_unpacking_into(folder, path, device_index=index, **options))
        except Exception as error:  # torch's own (zip, C++ loader) errors: a bad file, never a bug of ours
            reason = " ".join(str(error).split())[:200] or type(error).__name__
            raise ValueError(f"{path}: not a loadable pt2 package ({reason})") from None
        props = self.runner.get_metadata()
        compiled_for = props.get("AOTI_DEVICE_KEY", "cpu")
        if compiled_for != self.device.type:
            raise ValueError(f"{path}: compiled for {compiled_for}, asked to run on {self.device}; "
                             f"export it again with --device {self.device.type}")
        ours = {key: value for key, value in props.items() if not key.startswith(AOTI_KEY_PREFIX)}
        return read_model_info(ours, source=str(path))

    @property
    def runner(self) -> AOTICompiledModel:
        """The loaded package: ``runner(images)`` runs it, ``runner.get_metadata()`` is its metadata."""
        if not self._loaded:
            raise RuntimeError("this pt2 backend is closed")
        return self._loaded[0]

    def close(self) -> None:
        """Release the package: its CUDA graphs, then its loader and the files the load unpacked. Idempotent."""
        self._release()
        atexit.unregister(self._release)

    @property
    def forward(self) -> Callable[[torch.Tensor], Outputs]:
        """What :meth:`infer` calls on CUDA: the package from its CUDA graphs, or the package itself."""
        return self._graphs[0] if self._graphs else self.run

    @property
    def free_batch(self) -> bool:  # a fixed size (info.dynamic is false); the batch: batch_free (older packages: free)
        return self.info.batch_free is not False

    @property
    def name(self) -> str:  # type: ignore[override]  # what ran: a failed capture leaves the package's own run
        base = f"pt2 {self.info.precision}" + outputs_label(self.info)
        if not isinstance(self.forward, CudaGraphRunner):
            return base
        return base + (" cuda graph" if self.forward.failed is None else " eager")

    def run(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """uint8 ``[B, 3, H, W]`` on the device -> the package's outputs; the scaling to [0, 1] is part of a graph."""
        return tuple(self.runner(model_input(images, self.device, channels_last=False)))

    @torch.inference_mode()
    def infer(self, images: torch.Tensor) -> RawOutputs:
        self.check_input(images)
        if self.device.type != "cuda":
            run = self.run
        else:
            # AOTInductor's CUDA runner launches on the current stream of the *current* device: on cuda:1 with cuda:0
            # current that is another GPU's stream, unordered with this input's upload (as TensorRT's backend does).
            # CudaGraphRunner makes the input's device current around its calls.
            images, run = images.to(self.device, non_blocking=True), self.forward
        if self.free_batch:
            return run(images)  # type: ignore[return-value]  # boxes and scores
        return run_in_fixed_batches(run, images, self.info.batch)
