"""The values each enumerated flag accepts, in a module that imports nothing.

The option dataclasses are built from these, and with them every command's ``--help``: it prints without
importing torch. The module that acts on a flag checks it against the same tuple, imported from here; a value in
another case names its choice (:func:`canonical_choice`).
"""

PRECISION = ("auto", "fp16", "bf16", "fp32")  # --precision
PIXEL_AUGMENT = ("auto", "workers", "pixels", "device")  # --pixel-augment
CUDA_GRAPHS = ("auto", "on", "off")  # --cuda-graphs
CUDNN_BENCHMARK = ("auto", "on", "off")  # --cudnn-benchmark
RECOMPUTE = ("auto", "on", "off")  # --recompute
# --optimizer: every optimizer Ultralytics takes by name; the Adam family's share one setting
ADAM_FAMILY = ("AdamW", "Adam", "Adamax", "NAdam", "RAdam")
OPTIMIZER = ("auto", "SGD", *ADAM_FAMILY, "RMSprop", "MuSGD")
COCO_EVAL = ("faster", "pycocotools")  # --coco-eval; faster = faster-coco-eval
VAL_BACKGROUND = ("auto", "on", "off")  # --val-background
EXPORT_FORMAT = ("onnx", "engine", "pt2")  # export --format, one or several comma-separated
BENCHMARK_SKIP = ("pytorch", "onnx", "pt2", "engine")  # benchmark --skip, comma-separated


def canonical_choice(value: object, choices: tuple | None) -> object:
    """``value`` spelled as its choice when it differs only in case (``adamw`` -> ``AdamW``, as Ultralytics and
    torch name optimizers either way); anything else as it is, for the choices check to refuse."""
    if choices is None or not isinstance(value, str) or value in choices:
        return value
    matches = [choice for choice in choices if isinstance(choice, str) and choice.lower() == value.lower()]
    return matches[0] if len(matches) == 1 else value
