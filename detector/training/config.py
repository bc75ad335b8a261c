"""Training configuration: one flat, typed, commented set of defaults, validated once.

Every field becomes a ``train.py`` flag (``image_size`` -> ``--image-size``); the help text is the
comment beside it. Only ``build_*`` functions see the whole config; the rest take explicit arguments.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from detector.choices import COCO_EVAL as COCO_EVAL_CHOICES
from detector.choices import CUDA_GRAPHS as CUDA_GRAPH_CHOICES
from detector.choices import CUDNN_BENCHMARK as BENCHMARK_CHOICES
from detector.choices import PIXEL_AUGMENT as PIXEL_AUGMENT_CHOICES
from detector.choices import OPTIMIZER as OPTIMIZER_CHOICES
from detector.choices import PRECISION as PRECISION_CHOICES
from detector.choices import RECOMPUTE as RECOMPUTE_CHOICES
from detector.architecture import HEAD_LAYER, MODEL_NAMES, family_and_scale
from detector.choices import VAL_BACKGROUND as VAL_BACKGROUND_CHOICES
from detector.options import option
from detector.runs import name_problem
from detector.training.budget import parse_duration

# Defaults for the built-in shapes dataset, chosen so `python train.py` finishes in minutes on a 2-core CPU.
BUILTIN_IMGSZ = 320
BUILTIN_EPOCHS = 20  # the recipe's length: close-mosaic and warm-up keep their share of it under --time
# The demo promises to finish in under 10 minutes on any 2-core x86 CPU: with BF16 the 20 epochs fit in
# about 7; without it (FP32, ~3x slower) only a budget keeps the promise, so the built-in run has one.
BUILTIN_TIME = "8m"
# --freeze N freezes layers 0..N-1, numbered as Ultralytics numbers the model's family (detector.training.builders.
# freeze_layers maps them to our modules); the head is layer 22 in YOLOv8 and 23 in YOLO11 (HEAD_LAYER), so that
# count leaves only the head to train and more would leave nothing. With --weights the file decides the family, so up
# to 23 passes here and freeze_layers refuses 23 for a YOLOv8 model.
FREEZABLE_LAYERS = max(HEAD_LAYER.values())
SEED_MAX = 2**32 - 1  # --seed's largest: NumPy's legacy generator (np.random.seed) takes no more


@dataclass
class TrainConfig:
    # Data and model
    data: str = option("", "data YAML (Ultralytics-style or COCO JSON); empty = built-in synthetic shapes dataset")
    datasets_dir: str = option("", "root of downloaded datasets (--data coco) and the built-in one; empty = "
                                  "$DETECTOR_DATASETS, else datasets/ in the data folder")
    fraction: float = option(1.0, "train on the training split's first this share of images, e.g. 0.1 for a quick "
                                  "run (validation keeps all of its split)")
    single_cls: bool = option(False, "one class, 'item': every box of every class counts as it, in training and "
                                     "validation (Ultralytics' single_cls)")
    classes: tuple[int, ...] | None = option(None, "train and validate on these class ids' boxes only, e.g. --classes "
                                                   "0 2; the model keeps every class (Ultralytics' classes)")
    model: str = option("n", "model: YOLOv8 at a scale (n s m l x) or YOLO11 (11n 11s 11m 11l 11x)",
                        choices=MODEL_NAMES)
    weights: str = option("", "start from these weights: our .pt (best.pt, last.pt), or an Ultralytics YOLOv8 or "
                                "YOLO11 .pt, whose model it builds (bare names look in weights/; python -m detector "
                                "download yolo11n fetches one)")
    freeze: int = option(0, "freeze the first N layers, numbered as Ultralytics does (YOLOv8: 10 = the backbone, 22 = "
                            "all but the head; YOLO11: 11 = the backbone, 23 = all but the head): their weights and BN "
                            "affine parameters stay as loaded; 0 = train everything")
    imgsz: int = option(0, "image size (pixels, multiple of 32); 0 = 320 on the built-in dataset, else 640")
    epochs: int = option(0, "training epochs; 0 = tuned default on the built-in dataset, else 100")
    time: str = option("", "wall-clock budget for the whole run, e.g. 8m, 1.5h, 90s (bare number = hours): the epoch "
                         "count, LR schedule, warm-up and close-mosaic are fitted to it from a few timed steps before "
                         "the first one, then re-fitted after every epoch from its wall time (the LR schedule "
                         "continues without a jump); empty = no budget (the built-in dataset without --epochs: 8m)")
    batch: int = option(16, "images per step (per process under torchrun); -1 = auto: the largest that fits "
                            "--batch-memory of the GPU's memory (measured before the run), the default 16 on a CPU")
    batch_memory: float = option(0.6, "the share of the GPU's memory --batch -1 fills (Ultralytics' batch=0.7 is "
                                      "--batch -1 --batch-memory 0.7)")
    workers: int = option(-1, "data-loading worker processes; -1 = auto: 2 on the CPU, on CUDA the cores per process "
                            "minus one (at most 16); more than the cores per process are capped at them")
    cache: str = option("auto", "cache decoded images: auto (in RAM when they fit), ram, disk (a file kept with the "
                                "dataset, built once, read by later runs), none",
                        choices=("auto", "ram", "disk", "none"))
    device: str = option("", "cpu, cuda, cuda:N or N (= cuda:N); empty = cuda if available else cpu")
    seed: int = option(0, "random seed (data order, augmentation, multi-scale sizes, initial weights)")
    # Precision
    precision: str = option("auto", "auto: FP16 on CUDA, BF16 on CPUs with native BF16, else FP32", choices=PRECISION_CHOICES)
    unamp: bool = option(False, "true FP32 for ablations: no autocast, no loss scaling, TF32 off")
    channels_last: bool = option(True, "channels-last memory format (faster convolutions under AMP)")
    cuda_graphs: str = option("auto", "replay the training step as CUDA graphs after warm-up, one per input shape: "
                                    "auto = on CUDA in a single process (eager again, with one line, if capture "
                                    "fails), on = the same but says why when it cannot, off",
                              choices=CUDA_GRAPH_CHOICES)
    cudnn_benchmark: str = option("auto", "cuDNN autotuning on CUDA: auto = only where its per-shape timing pays back "
                                          "(few input shapes, many steps each), on, off", choices=BENCHMARK_CHOICES)
    recompute: str = option("auto", "recompute BatchNorm's outputs at strides 2 and 4 in the backward pass instead of "
                                    "keeping them (less GPU memory, a little more work): auto = on CUDA, on, off",
                            choices=RECOMPUTE_CHOICES)
    # Optimisation
    optimizer: str = option("auto", "SGD, AdamW (also Adam, Adamax, NAdam, RAdam, RMSprop), MuSGD (Muon + SGD), or "
                                    "auto (AdamW for runs of up to 10k steps, else SGD)", choices=OPTIMIZER_CHOICES)
    lr0: float = option(0.01, "initial learning rate (ignored where --optimizer auto picks AdamW, which picks its "
                              "own: name the optimizer to use it)")
    lrf: float = option(0.01, "final learning rate as a fraction of lr0")
    cosine: bool = option(False, "cosine learning-rate decay instead of linear")
    momentum: float = option(0.937, "SGD momentum / Adam beta1")
    weight_decay: float = option(5e-4, "weight decay at the nominal batch (scaled with the real one)")
    nominal_batch: int = option(64, "gradients accumulate until this many images per optimizer step")
    warmup_epochs: float = option(3.0, "warm-up length in epochs (at least 100 steps, at most a quarter of the run)")
    warmup_bias_lr: float = option(0.1, "starting learning rate of biases during warm-up")
    warmup_momentum: float = option(0.8, "starting momentum during warm-up")
    clip_grad: float = option(10.0, "clip the gradient norm to this (after unscaling)")
    ema_decay: float = option(0.9999, "EMA decay (ramped up over the first ~2000 updates)")
    # Loss
    box_gain: float = option(7.5, "box (CIoU) loss gain")
    cls_gain: float = option(0.5, "classification (BCE) loss gain")
    dfl_gain: float = option(1.5, "distribution focal loss gain")
    cls_pw: float = option(0.0, "class weights against imbalance: each class's classification loss times (1 / its "
                                "training boxes) ** cls_pw, normalised to a mean of 1; 0 = off, 1 = inverse frequency "
                                "(Ultralytics' cls_pw)")
    assigner_topk: int = option(10, "task-aligned assigner: candidates per box")
    assigner_alpha: float = option(0.5, "task-aligned assigner: class-score exponent")
    assigner_beta: float = option(6.0, "task-aligned assigner: IoU exponent")
    # Augmentation
    mosaic: float = option(1.0, "mosaic probability")
    close_mosaic: int = option(10, "turn mosaic off for the last N epochs")
    mixup: float = option(0.0, "MixUp probability: blend an item with a second augmented one, boxes of both "
                               "(Ultralytics' mixup; off in close-mosaic epochs, as there)")
    cutmix: float = option(0.0, "CutMix probability: paste a rectangle of a second augmented item that covers none "
                                "of this one's boxes, with the boxes it holds (Ultralytics' cutmix; off in "
                                "close-mosaic epochs, as there)")
    degrees: float = option(0.0, "random rotation (+/- degrees)")
    translate: float = option(0.1, "random translation (+/- fraction of image size)")
    scale: float = option(0.5, "random zoom gain (+/- fraction)")
    shear: float = option(0.0, "random shear (+/- degrees)")
    perspective: float = option(0.0, "random perspective: each coefficient in +/- this, per canvas pixel "
                                     "(Ultralytics' perspective, 0-0.001 typical; warped in the workers)")
    hsv_h: float = option(0.015, "hue shift (fraction of a full turn)")
    hsv_s: float = option(0.7, "saturation augmentation (fraction)")
    hsv_v: float = option(0.4, "value augmentation (fraction)")
    fliplr: float = option(0.5, "horizontal flip probability")
    flipud: float = option(0.0, "vertical flip probability")
    bgr: float = option(0.0, "channel-swap probability: feed a training image with its channels reversed (RGB as "
                             "BGR), the last pixel operation (Ultralytics' bgr)")
    albumentations: float = option(0.01, "probability of each albumentations pixel transform (blur, CLAHE, gray)")
    pixel_augment: str = option("auto", "where augmentation runs: workers (loader processes, OpenCV), pixels (HSV "
                                      "and flips batched on the training device), device (mosaic, affine, HSV and "
                                      "flips there; decoding, boxes and albumentations stay in the workers), "
                                      "auto = device on CUDA, workers elsewhere", choices=PIXEL_AUGMENT_CHOICES)
    rect: bool = option(False, "rectangular training batches (Ultralytics' rect=True): images in aspect-ratio order, "
                               "each batch warped into its own canvas (long side imgsz, the short side rounded up to "
                               "32) instead of the square, the batches' order shuffled every epoch; no mosaic, MixUp, "
                               "CutMix, multi-scale or CUDA graphs, and the warp in the loader workers")
    multi_scale: bool = option(True, "train at multiples of 32 in [min, max] x imgsz (imgsz in close-mosaic epochs)")
    multi_scale_min: float = option(0.875, "smallest multi-scale factor of imgsz")
    multi_scale_max: float = option(1.125, "largest multi-scale factor of imgsz (peak memory grows with its square)")
    multi_scale_hold: int = option(10, "steps each multi-scale size is held (fewer size changes)")
    # Evaluation, logging, output
    val_interval: int = option(1, "evaluate every N epochs, and always after the last (0: only after the last, "
                                  "Ultralytics' val=False)")
    patience: int = option(100, "stop when fitness has not improved for N epochs (counted where evaluated); 0 = never")
    val_conf: float = option(0.001, "validation confidence threshold")
    val_iou: float = option(0.7, "validation NMS IoU threshold")
    max_det: int = option(300, "detections kept per image in validation")
    val_rect: bool = option(True, "validation batches of similar aspect ratio, each padded only to its own shape "
                                  "(Ultralytics' rect val: 640x480 images run at 640x480, not 640x640)")
    coco_eval: str = option("faster", "COCO mAP evaluator: faster (faster-coco-eval, pycocotools' numbers in a fraction "
                                    "of the time; pycocotools when not installed) or pycocotools",
                          choices=COCO_EVAL_CHOICES)
    val_background: str = option("auto", "score each epoch's validation (the COCO evaluation) in a process of its own "
                                         "while the next epoch trains; its metrics line, results.csv row and best.pt "
                                         "then come at the next epoch's end (at once where the run ends or may "
                                         "stop); auto = on CUDA after epochs under a minute, on 4+ cores",
                                 choices=VAL_BACKGROUND_CHOICES)
    final_fp32: bool = option(False, "after training, evaluate best.pt again in true FP32 (TF32 off) whatever the "
                                     "training precision; its predictions go to predictions_fp32.json")
    plots: bool = option(True, "write PNG plots into the run folder")
    tensorboard: bool = option(False, "log scalars and plots to TensorBoard in the run folder")
    project: str = option("runs/train", "parent folder of run folders")
    name: str = option("exp", "run folder name (a number is appended if it exists)")
    save_period: int = option(0, "also keep weights/epochN.pt every N epochs, a resumable last.pt of that epoch "
                                 "(Ultralytics' save_period); 0 = off")
    resume: str = option("", "resume an interrupted run from its last.pt (or 'auto': the newest under --project); "
                               "a finished run's last.pt is stripped: fine-tune from it with --weights")
    amp_check: bool = option(True, "before training, compare one AMP step with FP32 and fall back if AMP misbehaves")
    sync_bn: bool = option(False, "SyncBatchNorm under torchrun")

    def with_defaults(self) -> "TrainConfig":
        """Fill the 'auto' (0) image size and epoch count: small and quick for the built-in dataset."""
        builtin = not self.data
        if builtin and self.epochs == 0 and not self.time:
            self.time = BUILTIN_TIME
        if self.imgsz == 0:
            self.imgsz = BUILTIN_IMGSZ if builtin else 640
        if self.epochs == 0:
            self.epochs = BUILTIN_EPOCHS if builtin else 100
        if self.data and not Path(self.data).is_absolute() and Path(self.data).is_file():
            # As a path from anywhere: a resume (or val of the checkpoint) from another folder finds it too.
            self.data = str(Path(self.data).resolve())
        return self

    def freeze_problem(self) -> str | None:
        """Why ``--freeze`` cannot work: beyond the head of ``--model``'s family, or of either family with ``--weights``
        (whose file decides the family: detector.training.builders.freeze_layers checks it then)."""
        family = None if self.weights or self.model not in MODEL_NAMES else family_and_scale(self.model)[0]
        most = FREEZABLE_LAYERS if family is None else HEAD_LAYER[family]
        if 0 <= self.freeze <= most:
            return None
        heads = f"{most} = all but the head" if family else "all but the head: 22 for YOLOv8, 23 for YOLO11 and YOLO26"
        return f"--freeze must be in [0, {most}] ({heads}; got {self.freeze})"

    def validate(self) -> "TrainConfig":
        """Reject values that cannot work, with a message naming the flag."""
        problems = []
        if self.epochs < 1:
            problems.append(f"--epochs must be at least 1 (got {self.epochs})")
        if self.batch < 1 and self.batch != -1:  # -1: detector/training/autobatch.py
            problems.append(f"--batch must be at least 1, or -1 for auto (got {self.batch})")
        if not 0 < self.batch_memory <= 1:
            problems.append(f"--batch-memory is a share of the GPU's memory, above 0 and at most 1 (got "
                            f"{self.batch_memory})")
        from detector.model import image_size_problem  # here, not at the top: --help never imports torch

        if (size_problem := image_size_problem(self.imgsz)) is not None:
            problems.append(size_problem)
        if self.workers < -1:
            problems.append(f"--workers must be >= 0, or -1 for auto (got {self.workers})")
        if not 0 < self.multi_scale_min <= 1 <= self.multi_scale_max:
            problems.append("--multi-scale-min must be in (0, 1] and --multi-scale-max >= 1")
        if self.time:
            try:
                parse_duration(self.time)
            except ValueError as error:
                problems.append(str(error))
        if problem := self.freeze_problem():
            problems.append(problem)
        if self.patience < 0:
            problems.append(f"--patience must be >= 0 (got {self.patience})")
        if self.unamp and self.precision not in ("auto", "fp32"):  # --unamp silently won over the other one
            problems.append(f"--unamp is true FP32 and --precision {self.precision} asks otherwise; give one")
        if problem := name_problem(self.name):  # here too: every rank checks it, not only the one that claims
            problems.append(problem)
        if self.val_interval < 0:
            problems.append(f"--val-interval must be 0 or more (got {self.val_interval})")
        if not 0.0 < self.fraction <= 1.0:
            problems.append(f"--fraction must be above 0 and at most 1 (got {self.fraction})")
        for name in ("mosaic", "mixup", "cutmix", "fliplr", "flipud", "bgr", "albumentations"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"--{name} is a probability in [0, 1] (got {getattr(self, name)})")
        # Fractions, as Ultralytics' settings check refuses them outside [0, 1] (--scale 2 drew negative zooms,
        # --lr0 -1 trained uphill, --momentum 1.5 failed only after the data scan).
        for name in ("lr0", "lrf", "weight_decay", "warmup_bias_lr", "warmup_momentum", "hsv_h", "hsv_s", "hsv_v",
                     "translate", "scale", "perspective", "val_conf", "val_iou", "cls_pw"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"--{name.replace('_', '-')} must be in [0, 1] (got {getattr(self, name)})")
        for name, low, high in (("momentum", 0.0, 1.0), ("ema_decay", 0.0, 1.0)):  # Adam's beta1 must stay below 1
            if not low <= getattr(self, name) < high:
                flag = f"--{name.replace('_', '-')}"
                problems.append(f"{flag} must be in [{low:g}, {high:g}) (got {getattr(self, name)})")
        for name, least in (("nominal_batch", 1), ("max_det", 1), ("close_mosaic", 0), ("warmup_epochs", 0),
                            ("seed", 0)):
            if getattr(self, name) < least:
                problems.append(f"--{name.replace('_', '-')} must be at least {least} (got {getattr(self, name)})")
        if self.seed > SEED_MAX:  # NumPy's legacy generator's range: it refused larger ones in its own words
            problems.append(f"--seed must be at most 2**32 - 1 = {SEED_MAX} (got {self.seed})")
        if problems:
            raise ValueError("; ".join(problems))
        if self.weights and not self.resume:  # before the data scan, minutes on COCO, that a bad file would waste
            from detector.checkpoint_problems import BOTH_READERS, file_start, not_a_checkpoint, start_problem
            from detector.weights.locate import resolve_weights

            path = resolve_weights(self.weights)  # a missing file: one line saying where it looked
            # A file that is no checkpoint at all, in val's and predict's words (read_foreign_weights), as
            # docs/security.md quotes them; an empty one says so.
            if (start := file_start(path)) is not None and (problem := start_problem(start)) is not None:
                raise ValueError(f"{path}: {not_a_checkpoint(start, which=BOTH_READERS) if start else problem}")
        return self

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if self.classes is not None:  # a list: config.yaml's safe_dump writes no tuples
            values["classes"] = list(self.classes)
        return values

    def changed(self) -> dict[str, Any]:
        """The fields set away from their defaults: what a command line or caller asked for."""
        default = TrainConfig()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        config = cls(**{k: v for k, v in values.items() if k in known})
        if config.classes is not None:  # config.yaml and checkpoints hold a list
            config.classes = tuple(config.classes)
        return config
