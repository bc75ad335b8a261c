"""Pre- and post-processing shared by every backend: letterbox in, original-pixel boxes out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from detector.data.augment import PAD_VALUE
from detector.data.letterbox import ImageMeta, letterbox, rect_batches, resized_size, unletterbox_rows
from detector.postprocess import detections_to_host

Detections = list[dict[str, torch.Tensor]]  # per image {boxes [N, 4] xyxy px, scores [N], labels [N]}
# The device letterbox resizes images of one shape together, at most this many bytes of FP32 pixels per call
# (10 1080p frames, 2 4K ones): the memory of one call stays bounded whatever --batch asks.
GROUP_BYTES = 256 << 20


def prepare_batch(
    images_rgb: list[np.ndarray], size: int, device: torch.device | str | None = None, *, tight: int | None = None
) -> tuple[torch.Tensor, list[ImageMeta]]:
    """RGB ``uint8 [H, W, 3]`` images -> ``uint8 [B, 3, size, size]`` letterboxed batch and how each was letterboxed
    (``image_id`` is the position in the batch).

    On the CPU (``device`` None or a CPU) with OpenCV; on a CUDA ``device`` with :func:`letterbox_on_device`,
    so only the uint8 originals cross the bus and the batch comes back on the GPU. ``tight`` (the model's largest
    stride; CPU only): pad the batch only to the smallest canvas of sides divisible by it that holds every image
    (a 640x480 photo at 640 px: 640x480, not 640x640), for a backend that takes any input shape as it is.
    """
    if device is not None and torch.device(device).type == "cuda":
        return letterbox_on_device(images_rgb, size, torch.device(device))
    canvas = None
    if tight and images_rgb:  # one batch: rect_batches puts every image on one canvas (square if they mix)
        shapes = np.array([image.shape[:2] for image in images_rgb])
        canvas = tuple(int(side) for side in rect_batches(shapes, size, len(images_rgb), tight)[1][0])
    tensors, transforms = [], []
    for index, image in enumerate(images_rgb):
        boxed, ratio, pad = letterbox(image, size, canvas)
        tensors.append(torch.from_numpy(np.ascontiguousarray(boxed.transpose(2, 0, 1))))
        resized = resized_size(*image.shape[:2], ratio)
        transforms.append(ImageMeta(index, image.shape[:2], ratio, pad, resized_hw=resized))
    return torch.stack(tensors), transforms


def to_original_pixels(detections: dict[str, torch.Tensor], transform: ImageMeta) -> dict[str, torch.Tensor]:
    """Undo the letterbox on one image's boxes and clip them to the original image (tensors come back on CPU)."""
    return batch_to_original_pixels([detections], [transform])[0]


def batch_to_original_pixels(detections: Detections, transforms: Sequence[ImageMeta]) -> Detections:
    """:func:`to_original_pixels` for a batch, with one device-to-host copy for all of it
    (:func:`~detector.postprocess.detections_to_host`), the letterbox undone for every row at once
    (:func:`unletterbox_rows`)."""
    if len(transforms) != len(detections):
        raise ValueError(f"{len(detections)} images' detections but {len(transforms)} letterbox records")
    return detections_to_host(detections, lambda boxes, counts: unletterbox_rows(boxes, transforms, counts))


def model_input(images: torch.Tensor, device: torch.device, *, channels_last: bool,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 ``[B, 3, H, W]`` batch -> float in [0, 1] on ``device``, in the memory layout the model runs in.

    ``dtype`` FP16 / BF16: what autocast's first convolution would cast an FP32 input to, to the bit (uint8 values
    are exact there, and half-precision division computes in FP32 and rounds once, as the cast does), without the
    FP32 batch (315 MB at 64 x 640 px) beside it.
    """
    layout = torch.channels_last if channels_last else torch.contiguous_format
    # The loader's batches are already channels-last, so on that path this is one conversion pass, no transpose.
    return images.to(device, non_blocking=True).contiguous(memory_format=layout).to(dtype).div_(255)


def letterbox_on_device(
    images_rgb: list[np.ndarray], size: int, device: torch.device
) -> tuple[torch.Tensor, list[ImageMeta]]:
    """:func:`prepare_batch` with the resize and padding done by torch on ``device`` (any device; CUDA is the point).

    Same geometry as :func:`detector.data.letterbox.letterbox`; the resize is bilinear with half-pixel centres,
    as OpenCV's INTER_LINEAR, which rounds its weights to 11 bits, so pixels may differ by one grey level.
    Images of one shape (a video's frames, a camera's batch) travel and resize together: one copy to the device,
    from pinned memory on CUDA so it does not hold the host, and one ``interpolate`` per shape, where one image at
    a time cost a blocking upload and a resize each. Two halves: :func:`stage_letterbox` on the host,
    :func:`finish_letterbox` queued on the device, so a caller can stage the next batch while the GPU works.
    """
    return finish_letterbox(stage_letterbox(images_rgb, size, pin=device.type == "cuda"), device)


@dataclass(frozen=True)
class StagedGroup:
    """Images of one shape in one host tensor ``uint8 [N, H, W, 3]``, and where each goes in the letterboxed batch."""

    host: torch.Tensor
    members: list[int]  # their places in the batch
    resized: tuple[int, int]  # (height, width) on the canvas
    offset: tuple[int, int]  # (left, top) padding
    ratio: float


@dataclass(frozen=True)
class StagedBatch:
    size: int
    count: int
    groups: list[StagedGroup]


def stage_letterbox(images_rgb: list[np.ndarray], size: int, *, pin: bool) -> StagedBatch:
    """The host half of :func:`letterbox_on_device`: each shape's images copied into one tensor, page-locked when
    ``pin`` (CUDA), so its upload does not hold the host (a 640x480 frame is 0.9 MB to copy): done for the next
    batch while the GPU runs this one (``predict``), it is hidden."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    for index, image in enumerate(images_rgb):
        by_shape.setdefault(image.shape[:2], []).append(index)
    groups = []
    for (height, width), same_shape in by_shape.items():
        ratio = size / max(height, width)
        new_h, new_w = resized_size(height, width, ratio)  # as letterbox() sizes it
        # The FP32 copy the resize reads is 12 bytes a pixel: 32 4K frames at once would hold 3 GB of it.
        per_call = max(1, GROUP_BYTES // (12 * height * width))
        for start in range(0, len(same_shape), per_call):
            members = same_shape[start : start + per_call]
            host = torch.empty((len(members), height, width, 3), dtype=torch.uint8, pin_memory=pin)
            for row, index in enumerate(members):
                copy_image(host[row], images_rgb[index])
            groups.append(StagedGroup(host, members, (new_h, new_w), ((size - new_w) // 2, (size - new_h) // 2), ratio))
    return StagedBatch(size, len(images_rgb), groups)


def copy_image(target: torch.Tensor, image: np.ndarray) -> None:
    """``target[...] = image`` by torch's copy, which spreads a large copy over the intra-op threads where numpy's
    assignment takes one: 32 640x480 frames, 29 MB, took 1.7 against 3.2 ms on 2 cores (a GPU host has 16). An array
    torch cannot view goes by numpy's: a negative stride (as a BGR->RGB flip gives), read-only memory, and any other
    dtype than uint8 (whose byte order or strides torch may refuse; numpy casts it as before)."""
    if image.dtype == np.uint8 and image.flags.writeable and all(stride >= 0 for stride in image.strides):
        target.copy_(torch.from_numpy(image))
    else:
        target.numpy()[...] = image


def finish_letterbox(staged: StagedBatch, device: torch.device) -> tuple[torch.Tensor, list[ImageMeta]]:
    """The device half of :func:`letterbox_on_device`: upload, resize and place each group (queued on CUDA)."""
    size = staged.size
    batch = torch.full((staged.count, 3, size, size), PAD_VALUE, dtype=torch.uint8, device=device)
    metas: dict[int, ImageMeta] = {}
    for group in staged.groups:
        (new_h, new_w), (left, top) = group.resized, group.offset
        height, width = group.host.shape[1:3]
        pixels = group.host.to(device, non_blocking=True).permute(0, 3, 1, 2)
        if (new_h, new_w) != (height, width):
            resized = F.interpolate(pixels.float(), size=(new_h, new_w), mode="bilinear", align_corners=False)
            pixels = resized.round_().clamp_(0, 255).to(torch.uint8)
        for row, index in enumerate(group.members):
            batch[index, :, top : top + new_h, left : left + new_w] = pixels[row]
            metas[index] = ImageMeta(index, (height, width), group.ratio, (float(left), float(top)),
                                     resized_hw=(new_h, new_w))
    return batch, [metas[index] for index in range(staged.count)]
