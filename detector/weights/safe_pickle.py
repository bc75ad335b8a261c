"""A restricted unpickler that reads third-party ``.pt`` checkpoints without running their code.

A checkpoint written by ``torch.save(model)`` is a pickle, and unpickling imports whatever globals the
file names and calls them: a file can name ``os.system`` as easily as ``torch.nn.Conv2d``. This module
is a drop-in ``pickle_module`` for :func:`torch.load` whose :meth:`Unpickler.find_class` allows

* torch's own tensor/storage rebuild functions, dtypes and a few plain containers (the same kind of
  list torch's ``weights_only`` loader keeps), and
* for the class paths a model pickle is made of (``ultralytics.*``, ``torch.nn.modules.*``, plus
  ``numpy``/``pathlib`` values that training metadata may hold), an inert :class:`StandIn` that only
  records the arguments and state the pickle hands it; the real class is never imported.

Everything else is refused with :class:`UnsafeCheckpointError`. Use :func:`load_checkpoint`.
"""

from __future__ import annotations

import _codecs
import _compat_pickle
import collections
import pickle
import types
import zipfile
from pathlib import Path
from typing import Any, ClassVar

import torch

from detector.checkpoint import refuse_on_old_torch
from detector.checkpoint_problems import load_problem, torchscript_problem, zip_problem


class UnsafeCheckpointError(pickle.UnpicklingError):
    """The checkpoint names a global that loading it would import and run."""


class StandIn:
    """Inert placeholder for an object whose class lives in a module we refuse to import.

    Pickle builds such objects either as ``cls.__new__(cls, *args)`` followed by ``__setstate__(state)``
    (plain classes such as ``nn.Module``) or as ``cls(*args)`` (``__reduce__`` results). Both paths only
    record what they are given. ``qualified_name`` (for example ``"torch.nn.modules.conv.Conv2d"``) is set
    on the per-global subclass :func:`stand_in_for` makes.
    """

    qualified_name: ClassVar[str] = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:  # noqa: PYI034 -- typing.Self needs Python 3.11
        instance = super().__new__(cls)
        instance.args = args
        instance.state = {}
        return instance

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # REDUCE calls cls(*args); nothing to run
        pass

    def __setstate__(self, state: Any) -> None:
        # (dict, slots) tuples come from classes with __slots__; keep the dict part, which holds nn.Module state.
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
            state = state[0]
        self.state = state if isinstance(state, dict) else {"_state": state}

    @property
    def class_name(self) -> str:
        """The original class name without its module, for example ``"C2f"``."""
        return self.qualified_name.rsplit(".", 1)[-1]

    def __repr__(self) -> str:
        return f"StandIn({self.qualified_name})"


_STAND_INS: dict[str, type[StandIn]] = {}


def stand_in_for(module: str, name: str) -> type[StandIn]:
    """One :class:`StandIn` subclass per global, so objects remember which class they stood in for."""
    qualified = f"{module}.{name}"
    if qualified not in _STAND_INS:
        _STAND_INS[qualified] = type(name, (StandIn,), {"qualified_name": qualified})
    return _STAND_INS[qualified]


# Module prefixes whose globals become stand-ins. Model classes must never be imported (ultralytics is
# AGPL, and importing arbitrary classes is how pickles run code); the numpy/pathlib entries cover metadata
# such as metric scalars and paths in ``train_args``, which we never need as real objects.
_STAND_IN_PREFIXES = ("ultralytics.", "torch.nn.modules.", "numpy.", "pathlib.")


# torch.save spells every tensor as a call to one of these (the same list torch's weights_only loader trusts).
_TENSOR_REBUILDERS = (
    "_rebuild_tensor",
    "_rebuild_tensor_v2",
    "_rebuild_tensor_v3",
    "_rebuild_parameter",
    "_rebuild_parameter_with_state",
    "_rebuild_qtensor",
    "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage",
    "_rebuild_nested_tensor",
    "_rebuild_device_tensor_from_cpu_tensor",
)


def _real_globals() -> dict[str, Any]:
    """Globals resolved to the real object: they only rebuild tensors or plain values."""
    allowed: dict[str, Any] = {
        "collections.OrderedDict": collections.OrderedDict,
        "builtins.set": set,
        "builtins.frozenset": frozenset,
        "builtins.slice": slice,
        "builtins.complex": complex,
        "builtins.bytearray": bytearray,
        "_codecs.encode": _codecs.encode,  # how protocol 2 spells ``bytes`` literals
        "torch.Size": torch.Size,
        "torch.device": torch.device,
        "torch.nn.parameter.Parameter": torch.nn.Parameter,
        "torch.serialization._get_layout": torch.serialization._get_layout,
        "torch._tensor._rebuild_from_type_v2": torch._tensor._rebuild_from_type_v2,
    }
    for name in _TENSOR_REBUILDERS:
        if hasattr(torch._utils, name):  # the set varies a little between torch releases
            allowed[f"torch._utils.{name}"] = getattr(torch._utils, name)
    for value in vars(torch).values():
        if isinstance(value, torch.dtype):
            allowed[str(value)] = value  # str(torch.float16) == "torch.float16"
    return allowed


_REAL_GLOBALS = _real_globals()


class Unpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only allow-listed globals; see the module docstring."""

    source: str = "<checkpoint>"  # file name for error messages; set by load_checkpoint

    def find_class(self, module: str, name: str) -> Any:
        # torch.save writes protocol 2, so names arrive in Python 2 spelling (``__builtin__.set``).
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        qualified = f"{module}.{name}"
        if qualified in _REAL_GLOBALS:
            return _REAL_GLOBALS[qualified]
        if qualified.startswith(_STAND_IN_PREFIXES):
            return stand_in_for(module, name)
        raise UnsafeCheckpointError(f"{self.source}: refuses to load global {qualified!r}")


def load_checkpoint(path: str | Path) -> Any:
    """Read a ``torch.save`` file into plain containers, CPU tensors and :class:`StandIn` objects.

    Raises:
        UnsafeCheckpointError: the file names a global outside the allow-list, or is a TorchScript
            archive (``torch.load`` would hand it to ``torch.jit.load``, which runs its code).
        CheckpointError: torch is older than :data:`detector.checkpoint.TORCH_FLOOR`.
        ValueError: the file is empty, cut short or no ``torch.save`` file (one line naming it).
    """
    path = Path(path)
    refuse_on_old_torch(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path):  # its member list is read: an unreadable one is said in our words
                pass
    except (zipfile.BadZipFile, OSError, EOFError) as error:  # looked like a zip but is not a readable one
        raise ValueError(f"{path}: {zip_problem(path) or f'not a readable checkpoint ({error})'}") from None
    if problem := torchscript_problem(path):  # in our reader's words: val and predict say it once for both readers
        raise UnsafeCheckpointError(f"{path}: {problem}")

    # torch.load subclasses ``pickle_module.Unpickler`` (to map storage types) and defers every other global to
    # our find_class, so the allow-list covers the whole file. A class attribute carries the name into messages.
    class _NamedUnpickler(Unpickler):
        source = str(path)

    def load_named(file: Any, **kwargs: Any) -> Any:
        return _NamedUnpickler(file, **kwargs).load()

    # torch.load reads ``__name__`` and uses ``Unpickler`` (zip format) or ``load`` (legacy format).
    pickle_module = types.SimpleNamespace(__name__=__name__, Unpickler=_NamedUnpickler, load=load_named)
    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=pickle_module)
    except UnsafeCheckpointError:
        raise
    except Exception as error:  # a truncated, empty or foreign file: torch raises many types, none a bug of ours
        raise ValueError(f"{path}: {load_problem(error, path)}") from None


def stand_in_state_dict(module: StandIn, prefix: str = "") -> dict[str, torch.Tensor]:
    """Flatten a stood-in ``nn.Module`` tree the way ``nn.Module.state_dict`` would.

    Reads the ``_parameters``, ``_buffers`` (minus non-persistent ones) and ``_modules`` entries that
    ``nn.Module.__getstate__`` pickles, so keys come out as ``"model.0.conv.weight"`` and so on.
    """
    if not isinstance(module, StandIn):
        raise TypeError(f"expected a pickled nn.Module at {prefix or '<root>'}, found {type(module).__name__}")
    state = module.state
    non_persistent = state.get("_non_persistent_buffers_set") or set()
    tensors: dict[str, torch.Tensor] = {}
    for name, value in (state.get("_parameters") or {}).items():
        if value is not None:
            tensors[prefix + name] = value.detach()
    for name, value in (state.get("_buffers") or {}).items():
        if value is not None and name not in non_persistent:
            tensors[prefix + name] = value
    for name, child in (state.get("_modules") or {}).items():
        if child is not None:
            tensors.update(stand_in_state_dict(child, f"{prefix}{name}."))
    return tensors
