"""Raw head maps -> final detections: DFL decode, confidence filter, class-aware NMS."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torchvision.ops import batched_nms

from detector.boxes import dfl_expectation, distances_to_boxes, flatten_head_outputs, make_anchors


def decode_outputs(outputs: list[torch.Tensor], strides: tuple[int, ...], reg_max: int) -> torch.Tensor:
    """Raw maps -> ``[B, A, 4 + C]``: xyxy boxes in input pixels, then per-class sigmoid scores."""
    flat = flatten_head_outputs(outputs).float()
    points, stride = make_anchors([o.shape[2:] for o in outputs], strides, device=flat.device, dtype=flat.dtype)
    distances = dfl_expectation(flat[..., : 4 * reg_max], reg_max)
    boxes = distances_to_boxes(points, distances) * stride
    return torch.cat((boxes, flat[..., 4 * reg_max :].sigmoid()), -1)


@dataclass(frozen=True)
class NMSConfig:
    conf_threshold: float = 0.25  # drop candidates below this class score
    iou_threshold: float = 0.7  # suppress same-class boxes overlapping more than this
    max_detections: int = 300  # keep at most this many per image
    max_candidates: int = 30000  # cap on boxes that enter NMS (bounds worst-case time)
    multi_label: bool = False  # one candidate per (box, class) above threshold, as COCO eval expects


def candidates(image_preds: torch.Tensor, config: NMSConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One image's ``[A, 4 + C]`` -> the (boxes ``[N, 4]``, scores ``[N]``, labels ``[N]``) that enter NMS."""
    boxes, class_scores = image_preds[:, :4], image_preds[:, 4:]
    if config.multi_label:
        anchor_idx, labels = (class_scores > config.conf_threshold).nonzero(as_tuple=True)
        scores = class_scores[anchor_idx, labels]
        boxes = boxes[anchor_idx]
    else:
        scores, labels = class_scores.max(1)
        keep = scores > config.conf_threshold
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
    # Top-k before NMS, as Ultralytics' max_nms=30000: bounds NMS's worst case. It changes the result only
    # for an image with more than max_candidates (box, class) pairs above conf, e.g. 8400 anchors x 80
    # classes at conf 0.001 on a barely trained model; then the lowest-scoring ones never enter NMS.
    if scores.numel() > config.max_candidates:
        top = scores.topk(config.max_candidates).indices
        boxes, scores, labels = boxes[top], scores[top], labels[top]
    return boxes, scores, labels


def non_max_suppression(decoded: torch.Tensor, config: NMSConfig = NMSConfig()) -> list[dict[str, torch.Tensor]]:
    """``[B, A, 4 + C]`` decoded predictions -> per image ``{boxes [N,4] xyxy px, scores [N], labels [N]}``.

    On the CPU, one ``batched_nms`` per image, on purpose: one call for the whole batch (groups = image x
    class) measured slower on CPU, 2.6x on the built-in data (benchmarks/val_speed.py) and 10x at 80 classes,
    because torchvision's large-input path masks every candidate once per group, O(groups x candidates).
    On CUDA the opposite holds (a launch per image costs more than the kernel): one call for the batch,
    :func:`batched_non_max_suppression`.
    """
    if decoded.is_cuda:
        return batched_non_max_suppression(decoded, config)
    # The candidates here, on torch's intra-op threads (their [anchors, classes] tensors are large enough to run in
    # parallel); then NMS itself, which torchvision runs on one core, releasing the GIL: images side by side, one
    # per intra-op thread's core (a pool per call, so no thread outlives it into a later fork of loader workers).
    # Validation's worst case (benchmarks/val_speed.py, 128 images, every pair above conf, 2 cores): NMS 0.89 s ->
    # 0.53 s per pass.
    per_image = [candidates(image_preds, config) for image_preds in decoded]
    threads = min(torch.get_num_threads(), len(per_image))
    if threads < 2:
        return [_kept(*image, config) for image in per_image]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda image: _kept(*image, config), per_image))


def _kept(
    boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, config: NMSConfig
) -> dict[str, torch.Tensor]:
    keep = batched_nms(boxes, scores, labels, config.iou_threshold)[: config.max_detections]
    return {"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]}


# torchvision's batched_nms runs one NMS over class-offset boxes up to 100,000 coordinates (25,000 boxes) on CUDA;
# above that it loops over every group (image x class), a host sync each: early in training, at conf 0.001, a
# batch of 16 holds ~134,000 candidates. So the batch goes in chunks of whole images under that.
ONE_CALL_BOXES = 25_000


def image_chunks(counts: list[int], limit: int) -> list[range]:
    """Consecutive images grouped so that each group's candidates stay within ``limit`` (an image above it alone)."""
    chunks, start, total = [], 0, 0
    for image, count in enumerate(counts):
        if image > start and count and total + count > limit:
            chunks.append(range(start, image))
            start, total = image, 0
        total += count
    return chunks + [range(start, len(counts))] if counts else chunks


def batched_non_max_suppression(decoded: torch.Tensor, config: NMSConfig = NMSConfig()) -> list[dict[str, torch.Tensor]]:
    """:func:`non_max_suppression` with one ``batched_nms`` call per chunk of images (:func:`image_chunks`;
    groups = image x class). The same result: boxes of different images or classes never suppress each other."""
    per_image = [candidates(image_preds, config) for image_preds in decoded]
    num_classes = decoded.shape[-1] - 4
    results = []
    for chunk in image_chunks([len(scores) for _, scores, _ in per_image], ONE_CALL_BOXES):
        results.extend(_one_call([per_image[image] for image in chunk], num_classes, config))
    return results


def _one_call(per_image: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], num_classes: int,
              config: NMSConfig) -> list[dict[str, torch.Tensor]]:
    counts = [len(scores) for _, scores, _ in per_image]
    device = per_image[0][0].device
    boxes = torch.cat([image_boxes for image_boxes, _, _ in per_image])
    scores = torch.cat([image_scores for _, image_scores, _ in per_image])
    labels = torch.cat([image_labels for _, _, image_labels in per_image])
    image_index = torch.repeat_interleave(torch.arange(len(counts), device=device), torch.tensor(counts, device=device))
    keep = batched_nms(boxes, scores, image_index * num_classes + labels, config.iou_threshold)  # by score
    kept_image = image_index[keep]
    results = []
    for image in range(len(counts)):
        mine = keep[kept_image == image][: config.max_detections]
        results.append({"boxes": boxes[mine], "scores": scores[mine], "labels": labels[mine]})
    return results


def postprocess(
    outputs: list[torch.Tensor], *, strides: tuple[int, ...], reg_max: int, config: NMSConfig = NMSConfig()
) -> list[dict[str, torch.Tensor]]:
    """Raw head maps -> detections in input-image pixels (undo any letterbox separately)."""
    return non_max_suppression(decode_outputs(outputs, strides, reg_max), config)
