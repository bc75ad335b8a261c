"""Ultralytics' argument names, and what each one is here: the one table the command line and the API share.

A user coming from Ultralytics types ``amp=False``, ``cos_lr=True``, ``nbs=64`` or ``model=yolo11n.pt``.
:func:`translate` turns those into our option fields (``precision="fp32"``, ``cosine=True``,
``nominal_batch=64``, ``weights="yolo11n.pt", model="11n"``) and says so in one line per alias, so the user learns
our name once. A name that has no equivalent answers in one line with what we do instead: given at
Ultralytics' own default (a value that asks for nothing, ``copy_paste=0.0``) it is accepted with a note; any other
value raises ``TypeError``, because silently ignoring a setting would train something the user did not ask for.

Names that are spelled the same here (``epochs``, ``lr0``, ``imgsz``, ``mosaic``, ...) are not in the table:
they are our fields already. The table was read from Ultralytics' ``cfg/default.yaml`` (detection only).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detector.architecture import MODEL_NAMES, display_name, model_name, standard_scale

COMMANDS = ("train", "val", "predict", "export", "benchmark")
# Ultralytics' names of the models built here, yolov8n ... yolo26x: weights (.pt), or a model file (.yaml).
ULTRALYTICS_NAME = re.compile(r"yolo(v8|11|26)([nsmlx])(\.pt|\.yaml)?")
NOTE = "_note"  # a key an alias's mapping may hold: what its note adds for this value (not a field)


@dataclass(frozen=True)
class Alias:
    """One Ultralytics name: ``means(value) -> {our field: value}``, or ``None`` when we have no equivalent.

    ``says``: for an alias, anything worth adding to the note; for no equivalent, what we do instead.
    ``harmless``: values (Ultralytics' defaults) that ask for nothing, accepted with a note when ``means`` is None.
    """

    means: Callable[[Any], dict[str, Any]] | None
    says: str = ""
    harmless: tuple[Any, ...] = ()


def renamed(ours: str) -> Alias:
    return Alias(lambda value: {ours: value})


def unsupported(says: str, *harmless: Any) -> Alias:
    return Alias(None, says, harmless)


def is_true(value: Any) -> bool:
    """``True``/``False`` as Python or YAML text gives them; anything else is refused (``ValueError``)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError("expected True or False")


def amp(value: Any) -> dict[str, Any]:
    """``amp=True`` -> precision auto (FP16 on CUDA after the AMP check, as there), ``False`` -> fp32;
    newer Ultralytics also takes ``'fp16'``/``'bf16'``/``'fp32'`` text."""
    if isinstance(value, str) and value.lower() in ("fp16", "bf16", "fp32"):
        return {"precision": value.lower()}
    return {"precision": "auto" if is_true(value) else "fp32"}


def cache(value: Any) -> dict[str, Any]:
    """``cache=True``/``'ram'`` -> ram, ``False`` -> none; ours (``auto``, ``disk``) pass through."""
    if isinstance(value, bool):
        return {"cache": "ram" if value else "none"}
    return {"cache": {"true": "ram", "false": "none"}.get(str(value).lower(), value)}


def device(value: Any) -> dict[str, Any]:
    """``device=0`` (or ``'0'``) -> ``cuda:0``; ``-1`` -> ``''``; ``'0,1'`` -> use torchrun (one process per GPU);
    else as given.

    Ultralytics reads ``-1`` as "the most idle GPU, else the CPU": our ``''`` (a GPU when one is visible, else the
    CPU) is that on one process. It was taken for the index ``cuda:-1``, a note naming a device that cannot exist.
    """
    text = str(value).strip()
    if text == "-1":
        return {"device": ""}
    if isinstance(value, int) and not isinstance(value, bool) or text.isdigit():
        return {"device": f"cuda:{int(text)}"}
    if "," in text or isinstance(value, (list, tuple)):
        raise ValueError("one device per process here; for several GPUs launch with torchrun --nproc_per_node N "
                         "(docs/distributed.md)")
    return {"device": value}


def train_model(value: Any) -> dict[str, Any]:
    """``model=yolo11n.pt`` (or ``yolo11n``, ``yolov8n.pt``, or any ``.pt`` path) -> ``--weights`` with its model;
    ``yolo11n.yaml`` -> ``--model 11n`` from scratch (``yolov8n.yaml``: ``n``, ``yolo26n.yaml``: ``26n``); our model
    names pass through. A model YAML that exists is read: only the standard YOLOv8, YOLO11 and YOLO26 architectures
    are accepted (detector/architecture.py)."""
    text = str(value)
    if text.lower() in MODEL_NAMES:
        return {"model": text.lower()}
    if text.lower().endswith((".yaml", ".yml")) and Path(text).is_file() and not other_ultralytics_family(
            text.rsplit("/", 1)[-1]):  # the file's architecture, not its name: an edited one is refused
        name, says = standard_scale(text)
        return {"model": name, NOTE: f"the file's architecture is {display_name(name)}'s{says}"}
    match = ULTRALYTICS_NAME.fullmatch(text.rsplit("/", 1)[-1].lower())
    name = model_name(match.group(1), match.group(2)) if match else ""  # the name's family: "v8", "11", "26"
    if match and match.group(3) == ".yaml":
        return {"model": name}
    if match:
        return {"weights": text if match.group(3) else f"{text}.pt", "model": name}
    if text.lower().endswith(".pt"):
        return {"weights": text}  # our own checkpoint or another Ultralytics file: the file decides the model
    family = other_ultralytics_family(text.rsplit("/", 1)[-1])
    built = f"{family} is not built here, only YOLOv8, YOLO11 and YOLO26 detection: " if family else ""
    raise ValueError(f"{built}expected a model (n ... x, 11n ... 11x, 26n ... 26x), yolov8n...yolov8x, "
                     "yolo11n...yolo11x or yolo26n...yolo26x (.pt or .yaml), or a .pt file")


def other_ultralytics_family(name: str) -> str | None:
    """``"yolo12n.pt"`` -> ``"YOLO12"``, ``"yolo26n-seg.pt"`` -> ``"YOLO26 segmentation"``: Ultralytics' names of
    weights this project cannot read; None for any other name (YOLOv8's, YOLO11's and YOLO26's detection models among
    them)."""
    match = re.fullmatch(r"(yolo)(v?\d+)([nsmlxbc]u?6?)?(-(seg|pose|cls|obb|world\w*|oiv7|p2|p6|ghost))?"
                         r"(\.pt|\.ya?ml)?", name.lower())
    if match is None or (match.group(2) in ("v8", "11", "26") and match.group(5) is None):
        return None
    family = "YOLO" + match.group(2)
    tasks = {"seg": "segmentation", "pose": "pose", "cls": "classification", "obb": "oriented-box",
             "p2": "with a P2 head", "p6": "with a P6 head", "ghost": "Ghost"}
    return f"{family} {tasks.get(match.group(5), match.group(5))}" if match.group(5) else family


def multi_scale(value: Any) -> dict[str, Any]:
    """Ultralytics' ``multi_scale=0.5`` (a +/- fraction of imgsz) -> our on/off and range; ours (a bool) as is."""
    if isinstance(value, bool) or isinstance(value, str) and value.lower() in ("true", "false"):
        return {"multi_scale": is_true(value)}
    fraction = float(value)
    if fraction <= 0:
        return {"multi_scale": False}
    return {"multi_scale": True, "multi_scale_min": max(1 - fraction, 0.125), "multi_scale_max": 1 + fraction}


def optimizer(value: Any) -> dict[str, Any]:
    """``optimizer=rmsprop`` -> ``RMSprop``: Ultralytics reads the name in any case."""
    from detector.choices import OPTIMIZER, canonical_choice

    chosen = canonical_choice(str(value), OPTIMIZER)
    if chosen not in OPTIMIZER:
        raise ValueError(f"choose one of {', '.join(OPTIMIZER)}")
    return {"optimizer": chosen}


def square_size(value: Any) -> dict[str, Any]:
    """``imgsz=640``, and Ultralytics' pairs (``[640, 640]``, ``640,640``) where both sides are equal: sizes are
    square here (an unequal pair is refused, naming the side to give)."""
    parts = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        numbers = [float(str(part).strip()) for part in parts]
    except ValueError:
        raise ValueError("expected a number of pixels") from None
    if not all(number.is_integer() for number in numbers):
        raise ValueError("expected a whole number of pixels")
    sides = {int(number) for number in numbers}
    if len(sides) != 1:
        raise ValueError(f"sizes are square here (the longer side, letterboxed): give one number, e.g. "
                         f"imgsz={max(sides)}")
    return {"imgsz": sides.pop()}


def nms(value: Any, *, export: bool = False) -> dict[str, Any]:
    """Ultralytics' ``nms=False``: YOLO26's NMS-free head (``--end-to-end``); ``True`` on export: NMS in the graph
    (``--nms``); ``None`` (its default), or ``True`` elsewhere, asks for nothing: NMS runs after the usual head."""
    if value is None or value == "":
        return {}
    return {"end_to_end": True} if not is_true(value) else {"nms": True} if export else {}


def batch(value: Any) -> dict[str, Any]:
    """``batch=16`` or ``-1`` as ours; Ultralytics' ``batch=0.7`` (the largest batch that fits that share of the
    GPU's memory) -> ``--batch -1 --batch-memory 0.7``."""
    if isinstance(value, float) and 0 < value < 1:
        return {"batch": -1, "batch_memory": value}
    return {"batch": value}


def weights(value: Any) -> dict[str, Any]:
    """``model=`` in val, predict and export: the file to run (ours, an Ultralytics yolov8*.pt, yolo11*.pt or
    yolo26*.pt, an export); ``yolo11n`` is ``yolo11n.pt``."""
    match = ULTRALYTICS_NAME.fullmatch(str(value).rsplit("/", 1)[-1].lower())
    return {"weights": f"{value}.pt" if match and not match.group(3) else value}


def resume(value: Any) -> Any:
    """``resume=True`` -> ``auto`` (the newest last.pt under --project), ``False`` -> no resume; a path as is.

    ``resume=True`` beside a weights file resumes that file instead (:func:`resume_and_weights`)."""
    if isinstance(value, bool) or str(value).lower() in ("true", "false"):
        return "auto" if is_true(value) else ""
    return value


def asks(value: Any, wanted: bool) -> bool:
    """``value`` is ``wanted`` as Python or ``key=value`` text gives it (a path or anything else is neither)."""
    return value is wanted or isinstance(value, str) and value.lower() == str(wanted).lower()


def resume_and_weights(resume: str, weights: str, *, resume_true: bool, pretrained_false: bool,
                       note: Callable[[str], None]) -> tuple[str, str]:
    """Train's ``(resume, weights)`` as Ultralytics reads them together: ``model=PATH resume=True`` resumes PATH.

    ``resume_true``: ``resume`` is ``auto`` because Ultralytics' ``resume=True`` asked (an explicit ``auto`` keeps
    the newest run). A file named twice is resumed once.

    Raises:
        TypeError: a resume file and a different weights file, or ``pretrained=False`` beside a weights file
            (which would be loaded all the same); one line.
    """
    resume, weights = str(resume or ""), str(weights or "")
    if resume and weights:
        if resume == "auto" and resume_true:
            note(f"note: Ultralytics' resume=True beside weights {weights!r} resumes that file: "
                 f"resume={weights!r} here")
            return weights, ""
        if resume != "auto" and Path(resume) != Path(weights):
            raise TypeError(f"resume={resume!r} and weights={weights!r} name different files: resume continues the "
                            f"run that wrote its file (with that run's settings), weights start a new run; give one")
        if resume != "auto":
            return resume, ""
    if pretrained_false and weights and not resume:
        raise TypeError(f"Ultralytics' pretrained=False beside weights={weights!r}: that file's weights would be "
                        f"loaded all the same; to train from scratch give a model instead (model=yolov8n.yaml or "
                        f"yolo11n.yaml, --model n or 11n), to fine-tune drop pretrained=False")
    return resume, weights


def named_weights(values: dict[str, Any]) -> str:
    """The weights file train's ``model=`` or ``weights=`` names in ``values`` ("" for none, a scale, a .yaml, or
    two different files: the alias loop refuses those naming both)."""
    files: set[Path] = set()
    if values.get("weights"):
        files.add(Path(str(values["weights"])))
    if values.get("model") is not None:
        try:
            named = train_model(values["model"]).get("weights")
        except ValueError:
            named = None  # refused by the alias loop, naming model=
        if named:
            files.add(Path(named))
    return str(files.pop()) if len(files) == 1 else ""


def settle_train_weights(values: dict[str, Any], note: Callable[[str], None]) -> dict[str, Any]:
    """``values`` with ``resume=True`` beside a named weights file read as resuming it (model/weights dropped).

    Runs before the alias loop, so that the notes say what happens (not ``resume='auto'``) and a conflict is
    refused before any note is printed."""
    file = named_weights(values)
    if not file:
        return values
    given = values.get("resume")
    resumed, kept = resume_and_weights("" if given is None else resume(given), file, resume_true=asks(given, True),
                                       pretrained_false=asks(values.get("pretrained"), False), note=note)
    if kept:  # nothing resumed: a fine-tune from the file
        return values
    return {**{name: value for name, value in values.items() if name not in ("model", "weights")}, "resume": resumed}


# Every command takes these.
COMMON: dict[str, Alias] = {
    "task": unsupported("this trainer detects objects only", "detect"),
    "mode": unsupported("the command names the mode (detector train|val|predict|export)", "train", "val",
                        "predict", "export"),
    "verbose": unsupported("the output is the same either way", True, False),
    "exist_ok": unsupported("a run never overwrites another: a taken --name gets a number appended "
                            "(exp, exp2, ...)", False, True),
    "device": Alias(device),
    "imgsz": Alias(square_size),
}
TRAIN: dict[str, Alias] = {
    **COMMON,
    "model": Alias(train_model),
    "half": unsupported("training precision is --precision (val, predict and export take --half)", False),
    "amp": Alias(amp),
    "cos_lr": renamed("cosine"),
    "nbs": renamed("nominal_batch"),
    "conf": renamed("val_conf"),  # Ultralytics' validation in training reads its conf and iou
    "iou": renamed("val_iou"),
    "box": renamed("box_gain"),
    "cls": renamed("cls_gain"),
    "dfl": renamed("dfl_gain"),
    "cache": Alias(cache),
    "multi_scale": Alias(multi_scale),
    # False beside a weights file is refused (resume_and_weights): the file would be loaded all the same.
    "pretrained": unsupported("start from weights with --weights (or model=yolov8n.pt); without them a run trains "
                              "from scratch", True, False),
    # val=True asks for nothing (the interval stays as given); val=False validates after the last epoch alone.
    "val": Alias(lambda value: {} if is_true(value) else {"val_interval": 0},
                 "the last epoch is still evaluated, as Ultralytics evaluates its final epoch"),
    # Label lines whose class id is not in the YAML's names are dropped, not merged: one name alone loses boxes.
    # False is what runs here do, so it asks for nothing either (it was refused: a common Ultralytics speed setting).
    "deterministic": unsupported("runs are seeded (--seed); bitwise-deterministic kernels are not forced (on a CPU a "
                                 "seeded run repeats exactly; on a GPU it does not: docs/training.md, "
                                 "reproducibility)", True, False),
    "profile": unsupported("time the backends with detector benchmark", False),
    "compile": unsupported("torch.compile is not used", False),
    "dropout": unsupported("classification only", 0.0),
    "copy_paste": unsupported("segmentation only", 0.0),
    "save": unsupported("checkpoints are always saved (weights/last.pt, best.pt)", True),
    "optimizer": Alias(optimizer),
    "batch": Alias(batch),
    # The rest of the keys of an Ultralytics run's args.yaml: other tasks' settings, and ours named otherwise.
    "label_smoothing": unsupported("no label smoothing in the classification loss", 0.0),
    "overlap_mask": unsupported("segmentation only", True),
    "mask_ratio": unsupported("segmentation only", 4),
    "kobj": unsupported("pose only", 1.0),
    "pose": unsupported("pose only", 12.0),
    "erasing": unsupported("classification only", 0.4),
    "auto_augment": unsupported("classification only", "randaugment"),
    "copy_paste_mode": unsupported("segmentation only", "flip"),
    "save_json": unsupported("every run writes predictions.json (COCO results) of its last evaluation", False, True),
    "save_dir": unsupported("the run folder is --project/--name (runs/train/exp)"),
    "cfg": unsupported("the command line reads it (detector train cfg=args.yaml); from Python give the settings as "
                       "keyword arguments", None),
    "resume": Alias(lambda value: {"resume": resume(value)}),
}
VAL: dict[str, Alias] = {
    **COMMON,
    "verbose": renamed("verbose"),  # ours too: the table printed or not
    "model": Alias(weights),
    "save_json": unsupported("predictions.json (COCO results) is always written", False, True),
    "save_txt": unsupported("val writes predictions.json; predict --save-txt writes YOLO txt labels", False),
    "save_hybrid": unsupported("no hybrid labels", False),
    "save_conf": unsupported("predict --save-txt --save-conf writes scores", False),
    "single_cls": unsupported("a one-class model (train single_cls=True) is scored as one class on its own; a "
                              "model of several classes is scored per class", False),
    "classes": unsupported("every class the data YAML names is scored (a model trained with classes= only those); "
                           "the per-class table gives each one's AP"),
    "dnn": unsupported("exported files run on ONNX Runtime or TensorRT", False),
    "nms": Alias(nms),
}
PREDICT: dict[str, Alias] = {
    **COMMON,
    "verbose": renamed("verbose"),  # ours too: a line per image or not
    "model": Alias(weights),
    "show": unsupported("save annotated images or video with --save (no window opens)", False),
    "visualize": unsupported("no feature-map visualisation", False),
    "retina_masks": unsupported("detection only", False),
    "embed": unsupported("no feature embeddings", None),
    "stream_buffer": unsupported("video frames are read into a small bounded queue ahead of the model", False),
    "show_boxes": unsupported("annotations always show the boxes", True),
    "dnn": unsupported("exported files run on ONNX Runtime or TensorRT", False),
    "nms": Alias(nms),
}
EXPORT: dict[str, Alias] = {
    **COMMON,
    "model": Alias(weights),
    "half": renamed("half"),
    "int8": unsupported("FP32 or FP16 (--half) only", False),
    "optimize": unsupported("mobile export is not supported", False),
    "keras": unsupported("ONNX and TensorRT only", False),
    "nms": Alias(lambda value: nms(value, export=True)),
}
BENCHMARK: dict[str, Alias] = {
    **COMMON,
    "model": Alias(weights),
    # Ultralytics' benchmark scores each format on data=; ours times every backend present, each precision the
    # hardware has (val --data scores one), so these ask for nothing more.
    "data": Alias(lambda value: {}),
    "half": unsupported("every backend is timed in FP32 and in FP16 (BF16 on a CPU with it) where it has them",
                        False, True),
    "int8": unsupported("FP32 and FP16 only", False),
    "format": unsupported("every backend present is timed; --skip leaves some out", ""),
}
TABLES = {"train": TRAIN, "val": VAL, "predict": PREDICT, "export": EXPORT, "benchmark": BENCHMARK}


def describe(values: dict[str, Any]) -> str:
    """``{"precision": "fp32", "cosine": True}`` -> ``precision='fp32' cosine=True``: our names, spelled as both
    the API and ``key=value`` command-line arguments take them (the flag is ``--`` + the name, ``_`` -> ``-``)."""
    return " ".join(f"{name}={str(value) if hasattr(value, '__fspath__') else value!r}"
                    for name, value in values.items())


def asks_for_nothing(value: Any, harmless: tuple[Any, ...]) -> bool:
    """``value`` is one of ``harmless`` (``1`` matches ``1.0``; ``0`` never matches ``False``)."""
    return any(value == ok and isinstance(value, bool) == isinstance(ok, bool) for ok in harmless)


def say(line: str) -> None:
    print(line, file=sys.stderr)


def translate(command: str, values: dict[str, Any], *, note: Callable[[str], None] = say) -> dict[str, Any]:
    """Ultralytics names in ``values`` -> our fields; every other name passes through unchanged (our own, or an
    unknown one, which the option object then refuses).

    Each alias says once, through ``note``, what it is here (nothing when it is already our name and value).
    In train, ``resume=True`` beside a weights file (``model=`` or ``weights=``) resumes that file.

    Raises:
        TypeError: a name with no equivalent given at a value that asks for something; one line saying what we
            do instead. Also when an alias and our own name for it are both given with different values, and for
            a resume file beside a different weights file.
        ValueError: an alias's value that cannot be converted (``amp='maybe'``), naming the alias.
    """
    return translate_with_sources(command, values, note=note)[0]


def translate_with_sources(command: str, values: dict[str, Any], *,
                           note: Callable[[str], None] = say) -> tuple[dict[str, Any], dict[str, str]]:
    """:func:`translate`, and for each field it sets the name in ``values`` that set it (the command line puts
    the field's flag where that ``key=value`` was, so that the later argument wins)."""
    table = TABLES[command]
    if command == "train":
        try:
            values = settle_train_weights(values, note)
        except TypeError as error:
            raise TypeError(f"{command}: {error}") from None
    out: dict[str, Any] = {}
    came_from: dict[str, str] = {}
    for name, value in values.items():
        alias = table.get(name)
        if alias is None:
            mapped = {name: value}
        elif value is None:
            continue  # Ultralytics' "unset": our default stands
        elif alias.means is None:
            if asks_for_nothing(value, alias.harmless):
                note(f"note: Ultralytics' {name}={value!r} has no equivalent here and changes nothing: {alias.says}")
                continue
            raise TypeError(f"{command}: Ultralytics' {name}={value!r} has no equivalent here: {alias.says}")
        else:
            try:
                mapped = alias.means(value)
            except ValueError as error:
                raise ValueError(f"{command}: {name}={value!r}: {error}") from None
            says = ", ".join(filter(None, (alias.says, mapped.pop(NOTE, ""))))
            if not mapped:
                note(f"note: Ultralytics' {name}={value!r} changes nothing here")
            elif set(mapped) != {name} or type(mapped[name]) is not type(value) or mapped[name] != value:
                extra = f" ({says})" if says else ""
                note(f"note: Ultralytics' {name}={value!r} is {describe(mapped)} here{extra}")
        for ours, converted in mapped.items():
            if ours in out and out[ours] != converted:
                raise TypeError(f"{command}: {came_from[ours]} and {name} both set {ours} "
                                f"({out[ours]!r} vs {converted!r}); give one")
            out[ours], came_from[ours] = converted, name
    return out, came_from
