"""A test's view of host reads: every place a GPU program would wait for the device, found on the CPU."""

from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detector.training.cuda_graph import innermost_ours


class HostReads(TorchDispatchMode):
    """Records each operator that must read device memory on the host: inside a CUDA graph capture each one
    fails the capture ("operation not permitted when stream is capturing"). Running a body under this mode on
    the CPU finds them without a GPU: the CPU kernels are the same operators, only they do not fail there.

    Caught: ``.item()``/``bool()``/``tolist()`` (``_local_scalar_dense``), ``nonzero``, ``masked_select`` and
    boolean-mask indexing and assignment, whose output size depends on the mask's contents, ``torch.tensor``
    of Python data, which on CUDA copies from pageable host memory and waits for it, and ``Tensor.cpu()``,
    ``tolist()`` and ``numpy()``.
    """

    SIZED_BY_DATA = {"aten::nonzero", "aten::_local_scalar_dense", "aten::masked_select", "aten::masked_scatter",
                     "aten::unique_consecutive", "aten::_unique2", "aten::unique_dim",
                     "aten::lift_fresh"}  # torch.tensor(data): on CUDA a blocking copy from pageable host memory
    INDEXING = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}

    # Copies to the host that run no operator on a CPU tensor (it is already there), so the dispatch mode never
    # sees them; patched on torch.Tensor while the mode is on.
    COPIES = ("cpu", "tolist", "numpy")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self._originals: dict[str, object] = {}

    def __enter__(self) -> HostReads:
        for name in self.COPIES:
            original = getattr(torch.Tensor, name)
            self._originals[name] = torch.Tensor.__dict__.get(name)  # None: inherited from TensorBase

            def copy(tensor: torch.Tensor, *args, _name: str = name, _original=original, **kwargs):
                self._record(f"Tensor.{_name}")
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, copy)
        return super().__enter__()

    def __exit__(self, *exc_info) -> None:
        for name, own in self._originals.items():
            if own is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)
        super().__exit__(*exc_info)

    def _record(self, name: str) -> None:
        # Where: the innermost caller in our code or torchvision's (the failure message then names the line), as a
        # failed capture's own line names it.
        where = innermost_ours(traceback.extract_stack())
        self.seen.append(f"{name} at {where}" if where else name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        indices = args[1] if name in self.INDEXING and len(args) > 1 else ()
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
            name = f"{name} with a boolean mask"
        elif name not in self.SIZED_BY_DATA:
            return func(*args, **(kwargs or {}))
        self._record(name)
        return func(*args, **(kwargs or {}))
