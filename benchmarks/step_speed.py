"""The bare training step (forward, loss, backward, optimizer + EMA), without the data loader: what each lever buys.

Each row runs in its own process, because oneDNN reads its kernel-cache size once per process. Batches come
from the built-in dataset (mosaic on, cached in RAM), so the loss sees realistic targets; the step is the
trainer's own (``detector.training.engine.optimizer_step``: fused optimizer, loss scaling on CUDA, the EMA).

    python benchmarks/step_speed.py                  # 320 px, batch 16, nano model, CPU
    python benchmarks/step_speed.py --cycles 4 --compile
    python benchmarks/step_speed.py --device cuda --imgsz 640 --batch 64   # the GPU's wall, batches kept on it

Rows on the CPU: FP32 / BF16 autocast, NCHW / channels-last, one fixed size / the default multi-scale sizes in
turn, and under multi-scale oneDNN's default kernel cache (1024) against the one detector sets and glibc's
default heap against the held one the trainer sets (detector/tuning.py explains both). On CUDA: FP32 (TF32
off, as --unamp) against FP16 autocast with loss scaling, NCHW / channels-last, fixed / multi-scale; the uint8
batches wait on the GPU, so no loader or host copy is timed, and the phases are timed between
``torch.cuda.synchronize()`` calls (which the training loop does not make, so images/s here is a floor).
Four more CUDA rows time the FP16 step without those syncs, eagerly and as CUDA graphs (``--cuda-graphs``,
detector/training/cuda_graph.py), at a fixed size and multi-scale: the pairs to compare; a fifth the default without
the recomputed activations (``--recompute off``, detector/model/recompute.py): what recomputing costs, and the peak
memory it saves. CUDA rows recompute as the trainer does by default, CPU rows do not. Prints a markdown
table of images/s, milliseconds per phase (input: resize + float conversion) and, on CUDA, the share of the
timed steps' wall time the GPU was busy (NVML, benchmarks/gpu_busy.py; the ``bench`` extra), n/a on the CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import torch
from gpu_busy import busy_text
from isolated import run_isolated

from detector.architecture import MODEL_NAMES, display_name
from detector.precision import resolve_precision
from detector.training.multiscale import MultiScale
from detector.tuning import ONEDNN_CACHE_ENV

ROW = r"""
import json, sys, time
import torch
from detector.tuning import enlarge_onednn_cache
enlarge_onednn_cache()  # as every run does first thing, before any convolution
from detector.data.augment import AugmentConfig
from detector.data.build import build_split
from detector.data.dataset import collate
from detector.data.spec import load_dataset_spec
from detector.data.synthetic import generate_shapes
from benchmarks.gpu_busy import sampler_for
from detector.training.ema import ModelEMA
from detector.training.engine import TrainStep, graphed_step, optimizer_step
from detector.training.step_input import step_input, step_input_dtype
from detector.training.schedule import StepSchedule
from detector.training.multiscale import MultiScale
from detector.loss import DetectionLoss
from detector.model import build_model
from detector.model.recompute import recompute_activations
from detector.training.optim import build_optimizer
from detector.precision import Precision
from detector.tuning import hold_freed_memory

args = json.loads(sys.argv[1])
device = torch.device(args["device"])
cuda = device.type == "cuda"
if not args["default_heap"] and not cuda:
    hold_freed_memory()  # as the trainer does on the CPU
if cuda:  # FP32 rows are true FP32, as --unamp; cuDNN autotuning as the trainer sets it for <= 8 shapes
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
spec = load_dataset_spec(generate_shapes())
model = build_model(num_classes=spec.num_classes, scale=args.get("scale", "n")).to(device).train()
# --recompute as the row asks; None: as the trainer's auto (on CUDA, off on the CPU)
recompute_activations(model, cuda if args.get("recompute") is None else args["recompute"])
if args["channels_last"]:
    model.to(memory_format=torch.channels_last)
criterion = DetectionLoss.for_model(model).to(device)
optimizer = build_optimizer(model, name="SGD", lr=0.001, momentum=0.9, weight_decay=5e-4, num_classes=spec.num_classes,
                            total_steps=10**6).optimizer  # fused where the device has it, as in training
precision = Precision(("fp16" if cuda else "bf16") if args["amp"] else "fp32", device.type, "benchmark")
scaler, ema = precision.make_scaler(), ModelEMA(model)
dataset = build_split(spec, "train", image_size=args["imgsz"], augment=AugmentConfig(), cache="ram").dataset
batches = [collate([dataset[(i + b * args["batch"], 0, True)] for i in range(args["batch"])]) for b in range(6)]
if cuda:  # kept on the GPU: the step alone, no host-to-device copy
    batches = [(images.to(device), targets, metas) for images, targets, metas in batches]
ladder = MultiScale(args["imgsz"], enabled=args["multi_scale"]).ladder()
step_model = torch.compile(model) if args["compile"] else model
phases = {"input": 0.0, "forward": 0.0, "loss": 0.0, "backward": 0.0, "optimizer": 0.0}
parameters = [p for p in model.parameters() if p.requires_grad]
finite = torch.ones((), dtype=torch.bool, device=device)  # made once: a Python bool would be copied over each step
graphs = None
if args["cuda_graphs"]:  # the trainer's captured step: a TrainStep's graphs, no warm-up in its schedule
    schedule = StepSchedule(epochs=1, steps_per_epoch=1, warmup_steps=0, base_lr=0.001, final_lr_fraction=1.0,
                            cosine=False, warmup_bias_lr=0.001, warmup_momentum=0.9, momentum=0.9,
                            batch_size=args["batch"], nominal_batch=args["batch"], clip_grad=10.0)
    train_step = TrainStep(model, criterion, optimizer, scaler, ema, precision, schedule, device,
                           channels_last=args["channels_last"], cuda_graphs="on")
    graphs = train_step.step_graphs(parameters)

input_dtype = step_input_dtype(precision, device)  # FP16 under CUDA FP16 autocast, as the trainer makes it


def clock(phase=True):
    if cuda and (phase is False or args["phases"]):
        torch.cuda.synchronize(device)
    return time.perf_counter()

def step(index, record):
    images, targets, _ = batches[index % len(batches)]
    size = ladder[(index * 7) % len(ladder)]  # every size in turn, not in order
    if graphs is not None:
        out = graphs.inputs.image_buffer((len(images), 3, size, size), device, channels_last=args["channels_last"],
                                         largest_side=max(ladder), dtype=input_dtype)  # as the trainer does
        x = step_input(images, size, device, channels_last=args["channels_last"], out=out)
        graphed_step(graphs, x, targets, with_optimizer=True, earlier_finite=finite)
        return
    tp = clock()
    x = step_input(images, size, device, channels_last=args["channels_last"]).to(input_dtype)
    t0 = clock()
    with precision.autocast():
        outputs = step_model(x)
    t1 = clock()
    loss, _ = criterion(outputs, targets, x.shape[2:])
    t2 = clock()
    scaler.scale(loss).backward()
    t3 = clock()
    optimizer_step(model=model, parameters=parameters, optimizer=optimizer, scaler=scaler, ema=ema,
                   precision=precision, clip_grad=10.0, loss_was_finite=finite)
    t4 = clock()
    if record:
        for name, seconds in zip(phases, (t0 - tp, t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            phases[name] += seconds

# Warm-up: every size's kernels built (compiled, with --compile); with graphs every (batch, size) pair met three
# times (two eager runs, then the capture), as the timed loop meets each pair: a batch's box count is its key too.
warmup = 3 * len(batches) * len(ladder) if graphs is not None else 2 * len(ladder)
for index in range(warmup):
    step(index, False)
if graphs is not None and graphs.failed:
    raise SystemExit(f"CUDA graphs failed: {graphs.failed}")
sampler = sampler_for(args["device"])
start = clock(False)
if sampler is not None:
    sampler.start()
for index in range(args["steps"]):
    step(index, True)
seconds = clock(False) - start
busy = sampler.stop() if sampler is not None else None
peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else float("nan")
timed = args["phases"] and graphs is None
print("RESULT", json.dumps({"images_per_s": args["steps"] * args["batch"] / seconds, "peak_mb": peak, "busy": busy,
                            **{k: 1000 * v / args["steps"] if timed else None for k, v in phases.items()}}))
"""

@dataclass(frozen=True)
class Row:
    label: str
    amp: bool  # BF16 autocast on the CPU, FP16 autocast + loss scaling on CUDA
    channels_last: bool
    multi_scale: bool
    default_cache: bool = False  # oneDNN's own 1024-entry kernel cache instead of detector's
    default_heap: bool = False  # glibc's own malloc behaviour instead of the held heap
    compile: bool = False
    phases: bool = True  # synchronize between phases to time them (CUDA); False: the step's own pace
    cuda_graphs: bool = False
    recompute: bool | None = None  # BatchNorm's largest outputs recomputed; None: the trainer's default (on CUDA)


ROWS = [
    Row("FP32, NCHW, fixed size", False, False, False),
    Row("FP32, channels-last, fixed size (= --unamp --no-multi-scale)", False, True, False),
    Row("BF16, NCHW, fixed size", True, False, False),
    Row("BF16, channels-last, fixed size (= --no-multi-scale)", True, True, False),
    Row("BF16, channels-last, multi-scale, oneDNN default cache", True, True, True, default_cache=True),
    Row("BF16, channels-last, multi-scale, glibc default heap", True, True, True, default_heap=True),
    Row("BF16, channels-last, multi-scale (= default)", True, True, True),
    Row("FP32, channels-last, multi-scale, glibc default heap", False, True, True, default_heap=True),
    Row("FP32, channels-last, multi-scale (= --unamp)", False, True, True),
]
COMPILE_ROW = Row("BF16, channels-last, fixed size, torch.compile", True, True, False, compile=True)
CUDA_ROWS = [
    Row("FP32 (TF32 off), channels-last, fixed size (= --unamp --no-multi-scale)", False, True, False),
    Row("FP16, NCHW, fixed size", True, False, False),
    Row("FP16, channels-last, fixed size (= --no-multi-scale)", True, True, False),
    Row("FP16, channels-last, multi-scale (= default)", True, True, True),
    Row("FP32 (TF32 off), channels-last, multi-scale (= --unamp)", False, True, True),
]
CUDA_GRAPH_ROWS = [
    Row("FP16, channels-last, fixed size, no phase syncs", True, True, False, phases=False),
    Row("FP16, channels-last, fixed size, CUDA graphs (= the default after warm-up, fixed size)", True, True, False,
        phases=False, cuda_graphs=True),
    Row("FP16, channels-last, multi-scale, no phase syncs", True, True, True, phases=False),
    Row("FP16, channels-last, multi-scale, CUDA graphs (= the default after warm-up)", True, True, True,
        phases=False, cuda_graphs=True),
    Row("FP16, channels-last, multi-scale, CUDA graphs, --recompute off", True, True, True, phases=False,
        cuda_graphs=True, recompute=False),
]
CUDA_COMPILE_ROW = Row("FP16, channels-last, fixed size, torch.compile", True, True, False, compile=True)


def run_row(row: Row, *, imgsz: int, batch: int, steps: int, device: str, scale: str = "n") -> dict:
    env = dict(os.environ)
    if row.default_cache:
        env[ONEDNN_CACHE_ENV] = "1024"  # oneDNN's own default; detector keeps a value set by the user
    else:
        env.pop(ONEDNN_CACHE_ENV, None)
    payload = {**asdict(row), "imgsz": imgsz, "batch": batch, "steps": steps, "device": device, "scale": scale}
    return run_isolated(ROW, payload, env=env)


# A row times at least this many steps: whole cycles of the multi-scale sizes, so each size is as often in it. At 128
# or 160 px the ladder has one size, and two cycles were two steps, too few to time on the CPU; at 640 (five sizes)
# two cycles are ten already.
MIN_TIMED_STEPS = 10


def timed_steps(imgsz: int, cycles: int) -> int:
    """Steps a row times: ``cycles`` whole cycles of the multi-scale ladder, more where that is under the minimum."""
    sizes = len(MultiScale(imgsz).ladder())
    return sizes * max(cycles, -(-MIN_TIMED_STEPS // sizes))


def step_alone(*, amp: bool, multi_scale: bool, imgsz: int, batch: int, device: str, cycles: int = 2,
               scale: str = "n", recompute: bool | None = None) -> dict:
    """The trainer's step alone (no loader) as a run with these settings trains after warm-up: channels-last,
    on CUDA without phase syncs and as CUDA graphs (FP32 steps are captured too); ``recompute``: ``--recompute on``
    or ``off`` (None: auto). For train_speed.py's step-alone column."""
    cuda = device.startswith("cuda")
    # AMP as the trainer resolves it (--precision auto): FP16 on CUDA, BF16 on a CPU with native BF16, else FP32 (a
    # CPU without it would time emulated BF16, ~7x slower than the FP32 loop beside it on a 2-core AVX2 EPYC).
    amp = amp and resolve_precision("auto", torch.device(device)).name != "fp32"
    row = Row("step alone", amp, True, multi_scale, phases=not cuda, cuda_graphs=cuda, recompute=recompute)
    # As many timed steps at a fixed size as multi-scale times (main's count): a cycle of one size would be one step.
    steps = timed_steps(imgsz, cycles)
    return run_row(row, imgsz=imgsz, batch=batch, steps=steps, device=device, scale=scale)


def ms_text(milliseconds: float | None) -> str:
    return "-" if milliseconds is None else f"{milliseconds:.1f}"


def peak_text(megabytes: float) -> str:
    """Peak GPU memory allocated; the CPU rows have none to report (NaN)."""
    return "-" if megabytes != megabytes else f"{megabytes:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--cycles", type=int, default=2,
                        help="timed steps per row = cycles x the multi-scale sizes, at least "
                             f"{MIN_TIMED_STEPS} (after two warm-up cycles)")
    parser.add_argument("--compile", action="store_true", help="add a torch.compile row (AMP, channels-last, fixed)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--model", default="n", choices=MODEL_NAMES,
                        help="a YOLOv8 scale, or 11n ... 11x, 26n ... 26x (default: n)")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    rows, compile_row = ([*CUDA_ROWS, *CUDA_GRAPH_ROWS], CUDA_COMPILE_ROW) if cuda else (ROWS, COMPILE_ROW)
    rows = [*rows, compile_row] if args.compile else rows
    steps = timed_steps(args.imgsz, args.cycles)  # whole cycles: every size equally often
    where = torch.cuda.get_device_name(args.device) if cuda else f"CPU, threads {torch.get_num_threads()}"
    print(f"{where}, {display_name(args.model)}, imgsz {args.imgsz}, batch {args.batch}, {args.cycles} cycles\n")
    print("| step | images/s | GPU busy | input ms | forward ms | loss ms | backward ms | optimizer + EMA ms | "
          "peak MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        r = run_row(row, imgsz=args.imgsz, batch=args.batch, steps=steps, device=args.device, scale=args.model)
        busy = busy_text(r["busy"]).removeprefix("GPU busy: ")
        print(f"| {row.label} | {r['images_per_s']:.1f} | {busy} | {ms_text(r['input'])} | {ms_text(r['forward'])} | "
              f"{ms_text(r['loss'])} | {ms_text(r['backward'])} | {ms_text(r['optimizer'])} | "
              f"{peak_text(r['peak_mb'])} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
