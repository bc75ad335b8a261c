"""Where validation's time goes: loader start-up, forward, decode, the loss, NMS, COCO results, P and R, pycocotools.

Runs the same stages as :func:`detector.metrics.loop.run_validation` (the loader, ``decode_images_with_maps``'
network and decode, the loss on the batch's targets as training's validation computes it, ``LossMeter``:
``--no-val-loss`` leaves it out, ``non_max_suppression``, ``to_coco_detections``, ``evaluate_coco``, and the mean P
and R of results.csv as training's passes score them: ``prediction_rows`` and ``mean_precision_recall``;
``--no-precision-recall`` leaves them out; the batch's one copy to the host is timed with the COCO results) on the model
as training's validator runs it (BatchNorm folded, channels-last: ``--no-fold``, ``--no-channels-last`` to
compare), timing each one, over ``--repeats`` passes in one process. The loader is made once and kept, as
training keeps it; the first pass's first batch is the cold start (worker processes forked), the later passes'
first batch the warm one.

    python benchmarks/val_speed.py                                      # built-in shapes, fresh model, --lively
    python benchmarks/val_speed.py --data ../shared/data/bccd/bccd.yaml --weights /tmp/val-runs/bccd/weights/best.pt
    python benchmarks/val_speed.py --no-fold                            # BatchNorm as trained, for comparison

A fresh model scores almost no box above conf 0.001, which under-measures NMS: ``--lively`` (the default without
``--weights``) zeroes the class-logit biases so every (anchor, class) pair enters NMS -- the worst case the
``max_candidates`` cap bounds. Its scores are all equal (0.5), so NMS's first pass over each image's best
candidates never settles there and runs again over all of them (``--first-pass``; a barely trained checkpoint
shows the first pass). Prints a markdown table: per pass, median and range over the repeats. Rows marked "not in the
total" are references: pycocotools' evaluation (``--coco-eval pycocotools``), and the matching with the confusion
matrix, as ``detector val``'s table and plots run it (``validation_stats``), which training's epochs skip.
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from detector.checkpoint import model_from_checkpoint
from detector.data.build import build_split
from detector.data.spec import load_dataset_spec
from detector.inference.cuda_graph import CudaGraphRunner
from detector.inference.fusion import FusedCopy
from detector.training.validator import graphed_forward, validation_dtype
from detector.inference.preprocess import model_input
from detector.loss import DetectionLoss
from detector.metrics.val_loss import LossMeter
from detector.metrics.coco import evaluate_coco, scored_detections, to_coco_detections
from detector.metrics.loop import make_val_loader
from detector.metrics.matching import mean_precision_recall, prediction_rows, validation_stats
from detector.model import build_model
from detector import postprocess
from detector.postprocess import NMSConfig, decode_outputs, detections_to_host, non_max_suppression
from detector.precision import resolve_precision
from detector.tuning import enlarge_onednn_cache

PR_STAGE, FULL_MATCHING = "P and R (matching)", "P and R with the confusion matrix (val's)"
STAGES = ("loader first batch", "loader other batches", "forward", "decode", "loss", "NMS", "COCO results",
          "COCO evaluation (faster-coco-eval)", PR_STAGE, "COCO evaluation (pycocotools)", FULL_MATCHING)
# What --coco-eval pycocotools would cost, and what the val command's matching costs: not in the total.
REFERENCE_STAGES = ("COCO evaluation (pycocotools)", FULL_MATCHING)


def lap(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def one_pass(model, loader, split, *, precision, device, nms: NMSConfig, channels_last: bool,
             graphs: CudaGraphRunner | None = None, losses: LossMeter | None = None,
             precision_recall: bool = True) -> dict[str, float]:
    """One validation pass; seconds per stage, candidate and detection counts. ``graphs``: the forward and decode
    replayed from them, as training's validator does on CUDA (timed as "forward"; "decode" is then 0). ``losses``:
    the loss of each batch from the same maps, as training's validation computes it (else "loss" is 0).
    ``precision_recall``: results.csv's P and R as training's pass scores them (else their stages are 0)."""
    seconds: dict[str, float] = defaultdict(float)
    detections_all, predictions = [], []
    start = lap(device)
    batches = iter(loader)  # the cold start forks the workers here, and a warm one hands them their indices
    for index, (images, targets, metas) in enumerate(batches):
        now = lap(device)
        seconds["loader first batch" if index == 0 else "loader other batches"] += now - start
        with torch.no_grad():
            if graphs is not None:
                decoded, *maps = graphs(images.to(device, non_blocking=True))
                t_forward = t_decode = lap(device)
            else:
                with precision.autocast():
                    maps = model(model_input(images, device, channels_last=channels_last))
                t_forward = lap(device)
                decoded = decode_outputs(maps, model.strides, model.reg_max)
                t_decode = lap(device)
            if losses is not None:
                losses.add(maps, targets, tuple(images.shape[2:]))
            t_loss = lap(device)
            detections = non_max_suppression(decoded, nms)
            t_nms = lap(device)
        # As run_validation: the batch to the host in one copy (timed with the COCO results), which the rows and the
        # matching both read.
        detections = detections_to_host(detections)
        detections_all.append(to_coco_detections(detections, metas, split.category_ids))
        t_coco = lap(device)
        if precision_recall:  # kept for the matching, as run_validation keeps them
            predictions.extend(zip(detections, metas))
        seconds[PR_STAGE] += lap(device) - t_coco
        seconds["forward"] += t_forward - now
        seconds["decode"] += t_decode - t_forward
        seconds["loss"] += t_loss - t_decode
        seconds["NMS"] += t_nms - t_loss
        seconds["COCO results"] += t_coco - t_nms
        seconds["candidates"] += int((decoded[..., 4:] > nms.conf_threshold).sum())
        start = lap(device)
    detections_all = np.concatenate(detections_all)
    seconds["detections"] = len(detections_all)
    seconds["scored"] = len(scored_detections(detections_all))  # what the evaluator reads: each class's best 100
    seconds.update(time_cocoeval(split, detections_all))
    if precision_recall:
        start = time.perf_counter()
        seconds["P"], seconds["R"] = mean_precision_recall(prediction_rows(predictions), split)
        seconds[PR_STAGE] += time.perf_counter() - start
        start = time.perf_counter()
        stats = validation_stats(predictions, split, len(split.category_ids))
        seconds[FULL_MATCHING] = time.perf_counter() - start
        assert (stats.mean_precision, stats.mean_recall) == (seconds["P"], seconds["R"])  # the same numbers
    return seconds


def time_cocoeval(split, detections: np.ndarray) -> dict[str, float]:
    """evaluate_coco (results loading, evaluate, accumulate, summarize) with each evaluator, timed whole."""
    out = {}
    image_ids = split.records.image_ids.tolist()
    for backend, name in (("faster", "faster-coco-eval"), ("pycocotools", "pycocotools")):
        start = time.perf_counter()
        result = evaluate_coco(split.ground_truth, detections, image_ids=image_ids, backend=backend)
        out[f"COCO evaluation ({name})"] = time.perf_counter() - start
        out[f"mAP50-95 {backend}"] = result.metrics["mAP50-95"]
    out["mAP50-95"] = out["mAP50-95 faster"]
    # Sanity: both evaluators give the same numbers (tests/metrics/test_coco.py holds them to 1e-12).
    assert abs(out["mAP50-95 faster"] - out["mAP50-95 pycocotools"]) < 1e-12
    return out


def spread(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    values = [v * scale for v in values]
    middle = f"{statistics.median(values):.{digits}f}"
    return middle if len(values) == 1 else f"{middle} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="", help="data YAML (default: the built-in shapes dataset)")
    parser.add_argument("--weights", default="", help="checkpoint (default: a fresh nano model)")
    parser.add_argument("--lively", action=argparse.BooleanOptionalAction, default=None,
                        help="zero the class-logit biases: all (anchor, class) pairs pass conf (default: no --weights)")
    parser.add_argument("--imgsz", type=int, default=0,
                        help="input size (default: the checkpoint's, else 640; 320 on the built-in data)")
    parser.add_argument("--batch", type=int, default=32, help="validation batch (training uses 2x its batch)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fp32", action="store_true", help="no autocast")
    parser.add_argument("--conf", type=float, default=0.001)
    parser.add_argument("--max-det", type=int, default=300)
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="on CUDA, the forward and decode replayed from CUDA graphs, as training's validator "
                             "does (timed together as 'forward'; default: on)")
    parser.add_argument("--fold", action=argparse.BooleanOptionalAction, default=True,
                        help="BatchNorm folded into the convolutions, as training's validation runs (default: on)")
    parser.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True,
                        help="channels-last weights and inputs, as training's default (default: on)")
    parser.add_argument("--val-loss", action=argparse.BooleanOptionalAction, default=True,
                        help="the loss on each batch's targets, as training's validation computes it (default: on)")
    parser.add_argument("--precision-recall", action=argparse.BooleanOptionalAction, default=True,
                        help="results.csv's mean P and R, matched as training's passes score them (default: on)")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the split (the loader is kept)")
    parser.add_argument("--first-pass", type=int, default=None,
                        help="NMS first over each image's best N candidates (default: detector.postprocess's "
                             "FIRST_PASS_CANDIDATES); 0: over all of them at once, as before it")
    parser.add_argument("--one-call-boxes", type=int, default=None,
                        help="on CUDA, candidates of whole images per NMS call (default: detector.postprocess's "
                             "ONE_CALL_BOXES); a small N gives each image a call of its own")
    parser.add_argument("--rect", action=argparse.BooleanOptionalAction, default=True,
                        help="rectangular batches, as training's validation by default (--no-rect: square ones)")
    parser.add_argument("--fixed-point-candidates", type=int, default=None,
                        help="on CUDA, images of at most N candidates through detector.postprocess.fixed_point_nms "
                             "(default: detector.postprocess's FIXED_POINT_CANDIDATES); 0: torchvision's kernel only")
    args = parser.parse_args()
    if args.fixed_point_candidates is not None:
        postprocess.FIXED_POINT_CANDIDATES = args.fixed_point_candidates
    if args.first_pass is not None:
        postprocess.FIRST_PASS_CANDIDATES = args.first_pass or 10**9
    if args.one_call_boxes is not None:
        postprocess.ONE_CALL_BOXES = args.one_call_boxes
    enlarge_onednn_cache()
    torch.manual_seed(0)
    if not args.data:
        from detector.data.synthetic import generate_shapes

        args.data = str(generate_shapes())
    spec = load_dataset_spec(Path(args.data))
    if args.weights:
        model, checkpoint = model_from_checkpoint(args.weights)
        size = args.imgsz or int((checkpoint.get("config") or {}).get("imgsz") or 640)
    else:
        model = build_model(num_classes=spec.num_classes)
        size = args.imgsz or (320 if "shapes" in args.data else 640)
    lively = args.lively if args.lively is not None else not args.weights
    if lively:
        for branch in model.head.cv3:
            branch[-1].bias.data.zero_()
    device = torch.device(args.device)
    model = model.to(device).float().eval()
    precision = resolve_precision("fp32" if args.fp32 else "auto", device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    if args.fold:  # the copy training's validator runs (FP16 weights under CUDA FP16)
        model = FusedCopy(model, dtype=validation_dtype(precision), channels_last=args.channels_last).refresh()
    split = build_split(spec, "val", image_size=size, augment=None, cache="none")
    # As the trainer's validator makes it: rectangular batches (--val-rect, its default) and, on CUDA, pinned.
    loader = make_val_loader(split, batch_size=args.batch, workers=args.workers, cpu_compute=device.type == "cpu",
                             pin_memory=device.type == "cuda", rect=args.rect)
    nms = NMSConfig(conf_threshold=args.conf, iou_threshold=0.7, max_detections=args.max_det, multi_label=True)
    graphs = None
    if args.cuda_graphs and device.type == "cuda":  # as training's validator runs them
        graphs = graphed_forward(model, precision, device, channels_last=args.channels_last)
    criterion = DetectionLoss.for_model(model).to(device)
    passes = [one_pass(model, loader, split, precision=precision, device=device, nms=nms,
                       channels_last=args.channels_last, graphs=graphs,
                       losses=LossMeter(criterion) if args.val_loss else None, precision_recall=args.precision_recall)
              for _ in range(args.repeats)]
    images = len(split.records)
    matched = f", P {passes[0]['P']:.3f} R {passes[0]['R']:.3f}" if args.precision_recall else ""
    print(f"\n{images} val images of {args.data}, imgsz {size}, batch {args.batch}, workers {args.workers}, "
          f"{device} {precision.name}, {'folded' if args.fold else 'BatchNorm kept'}, "
          f"{'channels-last' if args.channels_last else 'contiguous'}, {'rectangular' if args.rect else 'square'} "
          f"batches, {'with' if args.val_loss else 'without'} the loss, "
          f"{'with' if args.precision_recall else 'without'} P and R"
          f"{', pinned' if device.type == 'cuda' else ''}"
          f"{f', forward and decode from {len(graphs.graphs)} CUDA graphs' if graphs is not None else ''}, "
          f"weights {args.weights or 'fresh'}{' (lively)' if lively else ''}, "
          f"conf {args.conf}, max_det {args.max_det}, NMS first over {postprocess.FIRST_PASS_CANDIDATES} candidates"
          f"{f', at most {postprocess.ONE_CALL_BOXES} a call' if device.type == 'cuda' else ''}"
          f"{f', fixed point up to {postprocess.FIXED_POINT_CANDIDATES}' if device.type == 'cuda' else ''}; "
          f"{statistics.median(p['candidates'] for p in passes) / images:.0f} "
          f"(anchor, class) pairs above conf and {statistics.median(p['detections'] for p in passes) / images:.0f} "
          f"detections per image ({statistics.median(p['scored'] for p in passes) / images:.0f} scored); "
          f"mAP50-95 {passes[0]['mAP50-95']:.4f}{matched}; "
          f"{args.repeats} passes, loader kept\n")
    print("| stage | ms per pass, median (range) | ms per image | share |")
    print("|---|---|---|---|")
    stages = STAGES
    total = [sum(p[s] for s in STAGES if s not in REFERENCE_STAGES) for p in passes]
    for stage in stages:
        values = [p[stage] for p in passes]
        if stage == "loader first batch":
            label = f"{stage} (cold {values[0] * 1000:.0f} ms; warm below)"
            values = values[1:] or values
        else:
            label = f"{stage}, not in the total" if stage in REFERENCE_STAGES else stage
        share = f"{100 * statistics.median(values) / statistics.median(total):.0f}%"
        print(f"| {label} | {spread(values, 1000)} | {statistics.median(values) * 1000 / images:.1f} | {share} |")
    print(f"| total (pass 1 includes the cold start) | {spread(total, 1000)} | "
          f"{statistics.median(total) * 1000 / images:.1f} | 100% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
