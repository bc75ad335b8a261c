"""What one COCO evaluation costs on the host: our results conversion, then the evaluator's four steps.

A synthetic COCO-val-sized set (``--images`` 5000, 80 classes, ~7 ground-truth boxes an image, some crowd) and
``--detections`` per image in the form the model hands them over (letterboxed xyxy tensors, scores, labels,
one batch of 64 images at a time), timed through the same calls as the validation loop:
:func:`detector.metrics.coco.to_coco_detections` per batch, then :func:`detector.metrics.coco.evaluate_coco`
(results loaded, evaluate, accumulate, summarize) with each of ``--backends``. Prints a markdown table: wall
and CPU seconds (this process's and its children's).

    python benchmarks/coco_eval_speed.py                          # 5000 images x 300 detections, both backends
    python benchmarks/coco_eval_speed.py --images 500 --backends pycocotools

:func:`time_evaluation` is the importable form (``benchmarks/data_scale.py`` reports it as its validation row).
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import resource
import sys
import time
from collections.abc import Iterator

import numpy as np
import torch

from detector.data.ground_truth import load_coco
from detector.data.letterbox import ImageMeta
from detector.metrics.coco import BACKENDS, evaluate_coco, evaluator_name, to_coco_detections

NUM_CLASSES = 80
IMAGE_SIZE = 640  # the letterboxed input the synthetic detections live in
BATCH = 64  # images per to_coco_detections call, as the validation loader hands them over
IMAGE_SHAPES = ((480, 640), (640, 480), (427, 640), (640, 640))  # (height, width), COCO-like


def synthetic_ground_truth(images: int, *, seed: int = 0) -> dict:
    """COCO ground truth: ~7 boxes an image (Poisson), all three area ranges, 1% crowd, a few empty images."""
    rng = np.random.default_rng(seed)
    image_entries, annotations = [], []
    for image_id in range(1, images + 1):
        height, width = IMAGE_SHAPES[image_id % len(IMAGE_SHAPES)]
        image_entries.append({"id": image_id, "width": width, "height": height, "file_name": f"{image_id:012d}.jpg"})
        count = int(rng.poisson(7))
        sides = np.exp(rng.uniform(np.log(8), np.log(min(height, width) * 0.9), (count, 2)))  # small..large
        corners = rng.uniform(0, 1, (count, 2)) * (np.array([width, height]) - sides)
        for (x, y), (w, h) in zip(corners.tolist(), sides.tolist()):
            annotations.append({
                "id": len(annotations) + 1, "image_id": image_id, "category_id": int(rng.integers(1, NUM_CLASSES + 1)),
                "bbox": [x, y, w, h], "area": w * h, "iscrowd": int(rng.random() < 0.01),
            })
    categories = [{"id": k, "name": f"class{k}"} for k in range(1, NUM_CLASSES + 1)]
    return {"images": image_entries, "annotations": annotations, "categories": categories}


def synthetic_batches(
    ground_truth: dict, detections_per_image: int, *, seed: int = 1
) -> Iterator[tuple[list[dict[str, torch.Tensor]], list[ImageMeta]]]:
    """The model's output for every image, ``BATCH`` images at a time: half jittered copies of the ground
    truth (mostly the right class), half random boxes, in letterboxed-input pixels."""
    rng = np.random.default_rng(seed)
    truths: dict[int, list[list[float]]] = {}
    for annotation in ground_truth["annotations"]:
        truths.setdefault(annotation["image_id"], []).append([*annotation["bbox"], annotation["category_id"] - 1])
    detections, metas = [], []
    for image in ground_truth["images"]:
        height, width = image["height"], image["width"]
        ratio = IMAGE_SIZE / max(height, width)
        pad = ((IMAGE_SIZE - round(width * ratio)) // 2, (IMAGE_SIZE - round(height * ratio)) // 2)
        count = detections_per_image
        w, h = rng.uniform(4, width / 2, count), rng.uniform(4, height / 2, count)
        boxes = np.column_stack((rng.uniform(0, width - w), rng.uniform(0, height - h), w, h))
        labels = rng.integers(0, NUM_CLASSES, count)
        if image_truths := truths.get(image["id"]):
            truth = np.array(image_truths)[rng.integers(len(image_truths), size=count // 2)]
            jitter = rng.normal(0, 0.1, (len(truth), 4)) * truth[:, [2, 3, 2, 3]]
            boxes[: len(truth)] = truth[:, :4] + jitter
            keep_class = rng.random(len(truth)) < 0.8
            labels[: len(truth)] = np.where(keep_class, truth[:, 4], labels[: len(truth)])
        xyxy = np.column_stack((boxes[:, :2], boxes[:, :2] + boxes[:, 2:])) * ratio + np.tile(pad, 2)
        scores = rng.random(count)
        order = np.argsort(-scores)  # NMS hands them over sorted by score
        detections.append({"boxes": torch.from_numpy(xyxy[order]).float(),
                           "scores": torch.from_numpy(scores[order]).float(),
                           "labels": torch.from_numpy(labels[order])})
        metas.append(ImageMeta(image["id"], (height, width), ratio, (float(pad[0]), float(pad[1]))))
        if len(metas) == BATCH:
            yield detections, metas
            detections, metas = [], []
    if metas:
        yield detections, metas


def measure_evaluation(images: int, detections_per_image: int, backend: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process and its children) for one evaluation: see
    :func:`time_evaluation`. pycocotools runs on one thread; faster-coco-eval splits a large set by category
    over forked processes (one per core, up to 8), so its CPU time is the sum over them."""
    ground_truth = load_coco(synthetic_ground_truth(images))
    batches = list(synthetic_batches(ground_truth.dataset, detections_per_image))
    category_ids = list(range(1, NUM_CLASSES + 1))
    wall, cpu = time.perf_counter(), _cpu_seconds()
    results = np.concatenate([to_coco_detections(detections, metas, category_ids) for detections, metas in batches])
    evaluate_coco(ground_truth, results, backend=backend)
    return time.perf_counter() - wall, _cpu_seconds() - cpu


def _cpu_seconds() -> float:
    """User + system seconds of this process and of its children that have ended."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def time_evaluation(images: int, detections_per_image: int, backend: str) -> float:
    """Wall seconds for one evaluation of ``images`` x ``detections_per_image`` synthetic detections with
    ``backend`` (``faster`` or ``pycocotools``): results conversion, loading, evaluate, accumulate, summarize.
    Generating the set is not timed."""
    return measure_evaluation(images, detections_per_image, backend)[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000, help="validation images (COCO val: 5000)")
    parser.add_argument("--detections", type=int, default=300, help="detections per image (the --max-det default)")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS), help="evaluators to time")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"{args.images} images x {args.detections} detections ({args.images * args.detections:,} in all), "
          f"{NUM_CLASSES} classes\n")
    print("| evaluator | wall seconds | CPU seconds |\n|---|---|---|")
    for backend in args.backends:
        wall, cpu = measure_evaluation(args.images, args.detections, backend)
        print(f"| {evaluator_name(backend)} | {wall:.2f} | {cpu:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
