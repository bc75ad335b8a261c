"""Training speed, validation time, memory and mAP: detector (AMP and --unamp) vs Ultralytics YOLOv8n.

Same data, image size, batch size, epochs and worker count, one run after the other on this machine.
Each run is its own process. Every model is scored with the same pycocotools evaluation (Ultralytics'
best.pt is read into our model with detector.weights, so the decode and NMS are identical too). With
--repeats N the trainers take turns N times (A B C A B C ...) and the table gives medians with their
range; ratios are taken round by round, so a machine that drifts between rounds moves both sides of a
ratio together.

    python benchmarks/train_speed.py                      # built-in shapes dataset, 320 px, batch 16
    python benchmarks/train_speed.py --data ../shared/data/coco128/coco128.yaml --epochs 3
    python benchmarks/train_speed.py --runs amp,unamp     # without Ultralytics
    python benchmarks/train_speed.py --extra=--no-multi-scale   # our runs at a fixed size, as Ultralytics trains
    python benchmarks/train_speed.py --repeats 3          # medians of 3 rounds: single runs move by ~5-10% here
    python benchmarks/train_speed.py --device cuda --imgsz 640 --batch 64   # the GPU comparison (FP16 AMP)
    python benchmarks/train_speed.py --device cuda --bccd ../shared/data/bccd/bccd.yaml   # + wall clock to mAP
    python benchmarks/train_speed.py --device cuda --imgsz 640 --batch 64 --model s   # both trainers at YOLOv8s

On --device cuda the runs default to detector's default, fixed size (--no-multi-scale), --unamp and Ultralytics.
Columns: images/s of the first epoch (start-up, kernel autotuning, caches filling) and the steady state (median
of the later epochs), per epoch from results.csv (Ultralytics: its epoch callbacks). --bccd PATH adds a row per
trainer: 100 epochs at 640, batch 16, validating as each does by default, wall clock and final mAP50-95.

On a GPU two more columns: the share of the training process's wall time the GPU was busy (NVML sampled in a
background thread while the process runs, set-up and the final validation included; benchmarks/gpu_busy.py, the
``bench`` extra), and our runs' step alone (benchmarks/step_speed.py's row for the run's precision and sizes,
batches kept on the GPU, CUDA graphs as training uses them after warm-up) beside the loop's steady images/s:
their ratio is how much of its own step the loop reaches. ``--step-alone`` adds that column on the CPU too.

Prints a markdown table. Ultralytics (AGPL-3.0) is a benchmark extra: `pip install ultralytics`.
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import csv
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from gpu_busy import busy_text, sampler_for
from isolated import ROOT, run_isolated
from step_speed import step_alone

from detector.architecture import MODEL_NAMES, display_name
from detector.training.config import TrainConfig

ULTRALYTICS_TRAIN = r"""
import json, resource, sys, time
import torch
from ultralytics import YOLO
args = json.loads(sys.argv[1])
epochs = []
def start(trainer): epochs.append([time.perf_counter(), None])
def end(trainer): epochs[-1][1] = time.perf_counter()
model = YOLO(args.get("yaml", "yolov8n.yaml"))
model.add_callback("on_train_epoch_start", start)
model.add_callback("on_train_epoch_end", end)  # fires after the batches, before validation
close = {} if args.get("close_mosaic") is None else {"close_mosaic": args["close_mosaic"]}
model.train(data=args["data"], epochs=args["epochs"], imgsz=args["imgsz"], batch=args["batch"], workers=args["workers"],
            device=args["device"], project=args["project"], name=args.get("name", "ultralytics"), exist_ok=True,
            plots=False, seed=0, val=args.get("val", False), verbose=False, **close)
epoch_seconds = [b - a for a, b in epochs]
train_seconds = sum(epoch_seconds)
peak = (torch.cuda.max_memory_allocated() if args["device"] != "cpu" else
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**20
print("RESULT", json.dumps({"train_seconds": train_seconds, "epoch_seconds": epoch_seconds, "peak_mb": peak,
                            "weights": str(model.trainer.best),
                            "amp": bool(getattr(model.trainer, "amp", False))}))
"""

ULTRALYTICS_VAL = r"""
import json, sys, time
from ultralytics import YOLO
args = json.loads(sys.argv[1])
model = YOLO(args["weights"])
start = time.perf_counter()
# project=: its own folder beside the run's; without it Ultralytics writes runs/detect/val into the working directory
# (the checkout's).
metrics = model.val(data=args["data"], imgsz=args["imgsz"], batch=args["batch"] * 2, device=args["device"], plots=False,
                    workers=args["workers"], verbose=False, project=args["project"], name="ultralytics-val",
                    exist_ok=True)
print("RESULT", json.dumps({"val_seconds": time.perf_counter() - start, "own_map": float(metrics.box.map)}))
"""

OUR_VAL = r"""
import json, sys, time
import torch
from detector.data.build import build_split
from detector.data.spec import load_dataset_spec
from detector.inference.torch_backend import make_torch_infer
from detector.metrics.loop import Scoring, make_val_loader, run_validation
from detector.model import build_model
from detector.postprocess import NMSConfig
from detector.precision import resolve_precision
args = json.loads(sys.argv[1])
if args["weights"].endswith(".pt") and args.get("ultralytics"):
    from detector.weights import load_pretrained, read_ultralytics_checkpoint
    checkpoint = read_ultralytics_checkpoint(args["weights"])
    model = build_model(num_classes=len(load_dataset_spec(args["data"]).names), scale=checkpoint.scale,
                        class_channels=checkpoint.class_channels)
    load_pretrained(model, checkpoint)
else:
    from detector.checkpoint import model_from_checkpoint
    model, _ = model_from_checkpoint(args["weights"])
model.eval()
device = torch.device(args["device"])
model.to(device)
precision = resolve_precision("fp32" if args.get("fp32") else "auto", device)
start = time.perf_counter()
split = build_split(load_dataset_spec(args["data"]), "val", image_size=args["imgsz"], augment=None, cache="none")
infer = make_torch_infer(model, precision=precision, device=device,
                         nms=NMSConfig(conf_threshold=0.001, iou_threshold=0.7, max_detections=300, multi_label=True))
# pycocotools itself, so the table's "pycocotools" column is literally so (faster-coco-eval gives the same
# numbers within 1e-12: tests/metrics/test_coco.py)
loader = make_val_loader(split, batch_size=args["batch"] * 2, workers=args["workers"])
result = run_validation(infer, split, loader, progress=False, scoring=Scoring("pycocotools")).result
print("RESULT", json.dumps({"val_seconds": time.perf_counter() - start, "map": result.metrics["mAP50-95"],
                            "map50": result.metrics["mAP50"]}))
"""


def absolute_yaml(data: Path, out_dir: Path) -> Path:
    """Ultralytics resolves a relative `path` against its own datasets folder, not the YAML's: make it absolute."""
    from detector.data.catalog import datasets_root

    spec = yaml.safe_load(data.read_text())
    root = Path(spec.get("path") or ".")
    # The built-in set's YAML resolves against the datasets root (relative_to: datasets), where it was generated:
    # against the YAML's folder it named a second copy, which the first run then generated there.
    base = datasets_root() if spec.pop("relative_to", "yaml") == "datasets" else data.parent
    spec["path"] = str(root if root.is_absolute() else (base / root).resolve())
    spec.pop("download", None)
    spec.pop("generate", None)
    out = out_dir / "data.yaml"
    out.write_text(yaml.safe_dump(spec))
    return out


def busy_while(device: str, run: Callable[[], dict]) -> tuple[dict, float | None]:
    """``run()``'s result and the GPU's busy share while it ran (None on the CPU or without NVML)."""
    sampler = sampler_for(device)
    if sampler is not None:
        sampler.start()
    try:
        result = run()
    finally:
        busy = sampler.stop() if sampler is not None else None
    return result, busy


def train_ours(name: str, flags: list[str], args: argparse.Namespace, data: Path, project: Path) -> dict:
    """``flags`` come last, so a caller's ``--epochs`` / ``--val-interval`` override the benchmark's."""
    command = [sys.executable, str(ROOT / "train.py"), "--data", str(data), "--epochs", str(args.epochs), "--imgsz",
               str(args.imgsz), "--batch", str(args.batch), "--workers", str(args.workers), "--project", str(project),
               "--name", name, "--no-plots", "--val-interval", str(args.epochs), "--device", args.device,
               "--model", args.model, *close_mosaic_flags(args), *flags]
    project.mkdir(parents=True, exist_ok=True)
    log = project / f"{name}.log"  # the run's own output: on a GPU, what it said about its CUDA graphs
    start = time.perf_counter()
    with log.open("w") as output:
        process, busy = busy_while(args.device, lambda: subprocess.run(command, stdout=output, stderr=subprocess.STDOUT,
                                                                       cwd=ROOT, check=False))
    wall = time.perf_counter() - start
    lines = log.read_text(errors="replace").replace("\r", "\n").splitlines()
    if process.returncode != 0:
        raise RuntimeError(f"{name}: train.py exited with {process.returncode}:\n" + "\n".join(lines[-15:]))
    for line in lines:  # what a reader of a GPU run needs to see, printed as the run ends
        if any(word in line.lower() for word in ("cuda graphs", "cudnn", "warning", "fallback")):
            print(f"{name}: {line.strip()}", file=sys.stderr, flush=True)
    account = next((index for index, line in enumerate(lines) if line.startswith("time account")), None)
    if account is not None:  # where the wall clock went: start-up, training, validation, ... (a lease keeps this)
        table = itertools.takewhile(lambda line: line.startswith("  "), lines[account + 1:])  # its indented rows
        for line in [lines[account], *table]:
            print(f"{name}: {line.rstrip()}", file=sys.stderr, flush=True)
    accounted = json.loads((project / name / "time.json").read_text())["seconds"]["wall"]
    # The account starts with the process and ends at its last line: what is left is the process's exit. On an
    # H100 it was 5 s per loader worker (docs/gpu.md), invisible in every figure the run printed itself.
    print(f"{name}: process {wall:.1f} s, {wall - accounted:.1f} s of it after the time account (the exit)",
          file=sys.stderr, flush=True)
    rows = list(csv.DictReader((project / name / "results.csv").open()))
    train_seconds = sum(float(r["epoch_seconds"]) for r in rows)
    weights = project / name / "weights" / "last.pt"
    evaluation = run_isolated(OUR_VAL, {"weights": str(weights), "data": str(data), "imgsz": args.imgsz,
                                      "batch": args.batch, "workers": args.workers, "fp32": "--unamp" in flags,
                                      "device": args.device})
    return {"train_seconds": train_seconds, "wall_seconds": wall, "busy": busy,
            "peak_mb": max(float(r["peak_mem_mb"]) for r in rows),
            **({"peak_reserved_mb": max(float(r["peak_reserved_mb"]) for r in rows)} if "peak_reserved_mb" in rows[0]
               else {}),
            "precision": rows[-1]["precision"], "epoch_rates": [float(r["images_per_s"]) for r in rows],
            "data_wait": [float(r["data_wait"]) for r in rows], **evaluation}


def train_ultralytics(args: argparse.Namespace, data: Path, project: Path, *, val: bool = False) -> dict:
    # Ultralytics names GPUs by index ("0"), not "cuda:0".
    device = args.device if args.device == "cpu" else (args.device.partition(":")[2] or "0")
    payload = {"data": str(data), "epochs": args.epochs, "imgsz": args.imgsz, "batch": args.batch,
               "workers": args.workers, "project": str(project), "device": device, "val": val,
               "yaml": f"{display_name(args.model).lower()}.yaml", "close_mosaic": args.close_mosaic}
    start = time.perf_counter()
    trained, busy = busy_while(args.device, lambda: run_isolated(ULTRALYTICS_TRAIN, payload))
    wall = time.perf_counter() - start
    own = run_isolated(ULTRALYTICS_VAL, {**payload, "weights": trained["weights"]})
    ours = run_isolated(OUR_VAL, {"weights": trained["weights"], "data": str(data), "imgsz": args.imgsz,
                                "batch": args.batch, "workers": args.workers, "ultralytics": True, "fp32": True,
                                "device": args.device})
    # Validation time is Ultralytics' own val(); mAP is scored by the same pycocotools code as ours.
    precision = "fp16 AMP" if trained["amp"] else ("fp32 (AMP off on CPU)" if args.device == "cpu" else "fp32")
    images = len(__import__("detector.data.spec", fromlist=["x"]).load_dataset_spec(data).train.images)
    return {"train_seconds": trained["train_seconds"], "wall_seconds": wall, "peak_mb": trained["peak_mb"],
            "busy": busy,
            "epoch_rates": [images / seconds for seconds in trained["epoch_seconds"]],
            "precision": precision, "val_seconds": own["val_seconds"], "map": ours["map"],
            "map50": ours["map50"], "own_map": own["own_map"]}


RUNS = {"amp": "detector (AMP default)", "fixed": "detector --no-multi-scale", "unamp": "detector --unamp",
        "ultralytics": "Ultralytics YOLOv8n"}
BCCD = {"epochs": 100, "imgsz": 640, "batch": 16}  # the wall-clock-to-mAP row's settings


def spread(values: list[float], digits: int = 1) -> str:
    """Median, and the range when there is more than one value."""
    middle = f"{statistics.median(values):.{digits}f}"
    return middle if len(values) == 1 else f"{middle} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def epoch_columns(rates: list[float]) -> tuple[float, float]:
    """Images/s of the first epoch, and of the steady state (median of the later epochs; the first when alone)."""
    return rates[0], statistics.median(rates[1:] or rates)


def close_mosaic_flags(args: argparse.Namespace) -> list[str]:
    return [] if args.close_mosaic is None else ["--close-mosaic", str(args.close_mosaic)]


def mosaic_epochs(args: argparse.Namespace) -> int:
    """Epochs of the run with mosaic on, and so with our multi-scale: the rest are close-mosaic epochs, at imgsz.
    Both trainers close mosaic for the last ``close_mosaic`` epochs (default 10; Ultralytics 8.4 from epoch
    ``epochs - close_mosaic`` on), so a run of 10 epochs or fewer has none unless ``--close-mosaic`` says less."""
    close = TrainConfig.close_mosaic if args.close_mosaic is None else args.close_mosaic
    return max(args.epochs - close, 0)


def recompute_asked(extra: list[str]) -> bool | None:
    """What ``--extra``'s ``--recompute on|off`` asks (``--recompute=off`` too); None: the default (auto)."""
    value = None
    for index, token in enumerate(extra):
        if token.startswith("--recompute="):
            value = token.split("=", 1)[1]
        elif token == "--recompute" and index + 1 < len(extra):
            value = extra[index + 1]
    return {"on": True, "off": False}.get(value or "auto")


def step_alone_rate(run: str, extra: list[str], args: argparse.Namespace) -> float | None:
    """Images/s of the step alone (no loader) with ``run``'s precision and input sizes (step_speed.py's row); None,
    with the reason on stderr, when that measurement fails: the training runs already done still get their table."""
    print(f"timing the step alone for {run} ...", file=sys.stderr, flush=True)
    # The loop's sizes: multi-scale only where some epoch trains with mosaic (--unamp trains multi-scale too).
    multi_scale = run != "fixed" and "--no-multi-scale" not in extra and mosaic_epochs(args) > 0
    try:
        result = step_alone(amp=run != "unamp", multi_scale=multi_scale, imgsz=args.imgsz, batch=args.batch,
                            device=args.device, scale=args.model, recompute=recompute_asked(extra))
    except RuntimeError as error:
        print(f"step alone for {run} failed: {str(error).strip().splitlines()[-1]}", file=sys.stderr, flush=True)
        return None
    return result["images_per_s"]


def run_summary(name: str, result: dict) -> str:
    """One line per finished run, printed at once: a later failure or time limit cannot lose it."""
    busy = busy_text(result["busy"]).removeprefix("GPU busy: ") if result.get("busy") is not None else "-"
    return (f"{name}: {result['rate']:.1f} images/s, epochs {', '.join(f'{r:.1f}' for r in result['epoch_rates'])} "
            f"images/s, wall {result['wall_seconds']:.0f} s, val {result['val_seconds']:.1f} s, GPU busy {busy}, "
            f"peak {result['peak_mb']:.0f} MB"
            + (f" (reserved {result['peak_reserved_mb']:.0f} MB)" if "peak_reserved_mb" in result else "")
            + f", mAP50-95 {result['map']:.4f}"
            # The share of each epoch the loop sat waiting for the loader: high means the step is starved of data.
            + (f", waited for data {', '.join(f'{share:.0%}' for share in result['data_wait'])} of each epoch"
               if "data_wait" in result else ""))


def bccd_rows(args: argparse.Namespace, work: Path) -> list[str]:
    """Both trainers on BCCD for BCCD's epochs, validating as they do by default: wall clock and final mAP50-95."""
    (work / "bccd").mkdir(parents=True, exist_ok=True)
    data = absolute_yaml(Path(args.bccd), work / "bccd")
    settings = argparse.Namespace(**{**vars(args), **BCCD, "epochs": args.bccd_epochs})
    rows = []
    trainers = args.bccd_trainers.split(",")
    if "detector" in trainers:
        print("BCCD: running detector ...", file=sys.stderr, flush=True)
        ours = train_ours("bccd", ["--val-interval", "1"], settings, data, work / "bccd")
        rows.append(f"| detector (AMP default) | {ours['wall_seconds'] / 60:.1f} | {ours['map']:.4f} | "
                    f"{ours['map50']:.4f} |")
    if "ultralytics" in trainers:
        print("BCCD: running Ultralytics ...", file=sys.stderr, flush=True)
        theirs = train_ultralytics(settings, data, work / "bccd", val=True)
        rows.append(f"| Ultralytics {display_name(args.model)} | {theirs['wall_seconds'] / 60:.1f} | {theirs['map']:.4f} | "
                    f"{theirs['map50']:.4f} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="", help="data YAML (default: the built-in shapes dataset)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N for the GPU comparison")
    parser.add_argument("--runs", default="",
                        help="comma list of amp, fixed, unamp, ultralytics (default: all four on cuda; amp,unamp,"
                             "ultralytics on cpu); none: the BCCD rows alone")
    parser.add_argument("--bccd", default="", help="BCCD data YAML: add the wall-clock-to-mAP rows (100 epochs, 640)")
    parser.add_argument("--bccd-trainers", default="detector,ultralytics",
                        help="which trainers the BCCD rows run (one alone: the other's figures from another call)")
    parser.add_argument("--bccd-epochs", type=int, default=BCCD["epochs"], help="epochs of the BCCD rows (smoke tests)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of all runs; the table gives medians")
    parser.add_argument("--extra", default="", help="extra flags for our runs, e.g. '--no-multi-scale'")
    parser.add_argument("--model", default="n", choices=MODEL_NAMES,
                        help="both trainers' model: a YOLOv8 scale, or 11n ... 11x, 26n ... 26x (default: n; "
                             "issue 29 also asks for s)")
    parser.add_argument("--step-alone", action="store_true",
                        help="time each of our runs' step alone beside its loop (always on a GPU)")
    parser.add_argument("--close-mosaic", type=int, default=None,
                        help="both trainers' close-mosaic epochs (default: their own, 10, so a run of 10 epochs or "
                             "fewer has no mosaic, and ours trains at imgsz throughout); 0: mosaic, and our "
                             "multi-scale, all run long, as in most epochs of a long run")
    args = parser.parse_args()
    RUNS["ultralytics"] = f"Ultralytics {display_name(args.model)}"
    runs = (args.runs or ("amp,unamp,ultralytics" if args.device == "cpu" else ",".join(RUNS))).split(",")
    if args.runs == "none":
        if not args.bccd:
            parser.error("--runs none leaves only the BCCD rows: give --bccd")
        runs = []
    if unknown := [run for run in runs if run not in RUNS]:
        parser.error(f"--runs: unknown {', '.join(unknown)}; choose from {', '.join(RUNS)}")
    if not args.data:
        from detector.data.synthetic import generate_shapes

        args.data = str(generate_shapes())
    work = Path(tempfile.mkdtemp(prefix="train_speed_"))
    data = absolute_yaml(Path(args.data), work)
    images = len(__import__("detector.data.spec", fromlist=["x"]).load_dataset_spec(data).train.images)
    extra = args.extra.split()
    rounds: list[dict[str, dict]] = []
    for repeat in range(args.repeats):
        results = {}
        for run in runs:
            print(f"round {repeat + 1}/{args.repeats}: running {run} ...", file=sys.stderr, flush=True)
            project = work / f"round{repeat}"
            if run == "amp":
                results[RUNS[run]] = train_ours("amp", extra, args, data, project)
            elif run == "fixed":
                results[RUNS[run]] = train_ours("fixed", ["--no-multi-scale", *extra], args, data, project)
            elif run == "unamp":
                results[RUNS[run]] = train_ours("unamp", ["--unamp", *extra], args, data, project)
            else:
                try:
                    results[RUNS[run]] = train_ultralytics(args, data, project)
                except Exception as error:  # not installed, or failing: our rows and their step alone still print
                    print(f"ultralytics: not run ({type(error).__name__}: {str(error)[:300]})", file=sys.stderr,
                          flush=True)
                    continue
            results[RUNS[run]]["rate"] = images * args.epochs / results[RUNS[run]]["train_seconds"]
            print(run_summary(RUNS[run], results[RUNS[run]]), file=sys.stderr, flush=True)
        rounds.append(results)
    runs = [run for run in runs if all(RUNS[run] in results for results in rounds)]  # those that ran every round
    if runs:
        main_table(args, runs, rounds, images, extra)
    if args.bccd:
        print(f"\nBCCD ({args.bccd}): {args.bccd_epochs} epochs, imgsz {BCCD['imgsz']}, batch {BCCD['batch']}, "
              f"device {args.device}, each trainer validating as by default; mAP by the same pycocotools code\n")
        print("| trainer | wall minutes to the end | final mAP50-95 | mAP50 |")
        print("|---|---|---|---|")
        print("\n".join(bccd_rows(args, work)))
    return 0


def main_table(args: argparse.Namespace, runs: list[str], rounds: list[dict[str, dict]], images: int,
               extra: list[str]) -> None:
    """The runs' table (medians over the rounds) with the step alone beside each of ours, and the ratios."""
    alone = {run: step_alone_rate(run, extra, args) for run in runs
             if run != "ultralytics" and (args.step_alone or args.device != "cpu")}
    memory = "peak GPU memory MB" if args.device != "cpu" else "peak RSS MB"
    mosaic = mosaic_epochs(args)
    regime = (f"mosaic (and our multi-scale) in {'all' if mosaic == args.epochs else f'the first {mosaic}'} epochs"
              if mosaic else "no mosaic (close-mosaic epochs all run long; ours at imgsz)")
    print(f"\n{images} train images, {display_name(args.model)}, {args.epochs} epochs, {regime}, imgsz {args.imgsz}, "
          f"batch {args.batch}, workers {args.workers}, device {args.device}, {args.repeats} round(s), "
          f"data {args.data}\n")
    print(f"| trainer | precision | train images/s | first epoch images/s | steady images/s | step alone images/s | "
          f"steady / step | GPU busy | wall s (whole run) | val s | {memory} | mAP50-95 (pycocotools) | mAP50 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run, name in ((run, RUNS[run]) for run in runs):
        for r in rounds:
            r[name]["first"], r[name]["steady"] = epoch_columns(r[name]["epoch_rates"])
        keys = ("rate", "first", "steady", "wall_seconds", "val_seconds", "peak_mb", "map", "map50")
        column = {key: [r[name][key] for r in rounds] for key in keys}
        step_rate = alone.get(run)
        versus = f"{statistics.median(column['steady']) / step_rate:.2f}" if step_rate else "-"
        busy = [r[name]["busy"] for r in rounds if r[name]["busy"] is not None]
        busy_column = busy_text(statistics.median(busy) if busy else None).removeprefix("GPU busy: ")
        print(f"| {name} | {rounds[-1][name]['precision']} | {spread(column['rate'])} | {spread(column['first'])} | "
              f"{spread(column['steady'])} | {f'{step_rate:.1f}' if step_rate else '-'} | {versus} | {busy_column} | "
              f"{spread(column['wall_seconds'], 0)} | {spread(column['val_seconds'])} | {max(column['peak_mb']):.0f} | "
              f"{spread(column['map'], 4)} | {spread(column['map50'], 4)} |")
    for a, b in (("amp", "ultralytics"), ("fixed", "ultralytics"), ("amp", "unamp")):
        if a in runs and b in runs:
            ratios = [r[RUNS[a]]["rate"] / r[RUNS[b]]["rate"] for r in rounds]
            how = " (median of per-round ratios)" if len(ratios) > 1 else ""
            print(f"{RUNS[a]} vs {RUNS[b]}: {spread(ratios, 2)}x images/s{how}")


if __name__ == "__main__":
    sys.exit(main())
