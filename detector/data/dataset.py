"""Detection dataset: decoded (optionally RAM-cached) images, augmented for training, letterboxed for eval."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from detector.data.augment import (
    PAD_VALUE,
    AugmentConfig,
    affine_matrix,
    augment_hsv,
    build_albumentations,
    draw_channel_swap,
    draw_flips,
    draw_hsv,
    flip_boxes,
    flip_image,
    is_affine,
    mosaic_boxes,
    mosaic_placements,
    mosaic_tiles,
    paste,
    swap_channels,
    warp_boxes,
    warp_image,
)
from detector.data.batch_augment import PixelOps
from detector.data.cutmix import boxes_inside, choose_rectangle, draw_rectangles, paste_rectangle
from detector.data.device_augment import WarpBatch, WarpSource, canvas_region, pack_warp_batch
from detector.data.images import READ_ERRORS, read_image_rgb
from detector.data.letterbox import RESIZE_INTERPOLATION, ImageMeta, letterbox, resized_size
from detector.data.ram_cache import ImageCache
from detector.data.records import Records
from detector.data.spec import DatasetError
from detector.data.workers import batch_tensor

cv2.setNumThreads(0)  # loader workers give the parallelism; OpenCV's own threads would oversubscribe 2 cores

MAX_REPLACEMENTS = 16  # tries to find a decodable image in place of one that failed, before giving up


class UnreadableImage(OSError):
    """An image that passed the start-up check but failed to decode now (changed on disk, or corrupt inside)."""

    def __init__(self, path: str, error: Exception) -> None:
        super().__init__(f"{path}: failed to decode ({str(error).strip() or type(error).__name__})")
        self.path = path


class DetectionDataset(Dataset):
    """Images and labels for one split.

    Training items are ``(image uint8 [3, S, S], labels [n, 5] (class, cx, cy, w, h normalised), meta)``
    after mosaic/affine/HSV/albumentations/flip/channel swap (under ``--rect``, ``[3, H, W]``: the image alone,
    warped into its batch's canvas, labels normalised by it); evaluation items are letterboxed to ``S x S`` (or to
    their rectangular batch's canvas) with no augmentation (:meth:`with_canvases`). With ``pixel_ops_on_device`` the
    HSV operations, flips and channel swap are drawn as always and the boxes flipped, but the pixels are left to the
    training step: ``meta.pixel_ops`` carries them there
    (:mod:`detector.data.batch_augment`). With ``geometry_on_device`` too, mosaic and the random affine are
    drawn and the boxes moved, but the item's image is a :class:`WarpSource` (the source pixels the warp
    reads, and its matrix) that the training step warps (:mod:`detector.data.device_augment`); the step's warp is
    affine, so an item with a perspective term, like one with MixUp or CutMix, is warped here and sent as its pixels.
    """

    def __init__(
        self,
        records: Records,
        *,
        image_size: int,
        augment: AugmentConfig | None = None,
        image_cache: ImageCache | None = None,
        seed: int = 0,
        pixel_ops_on_device: bool = False,
        geometry_on_device: bool = False,
    ) -> None:
        self.records = records
        self.image_size = image_size
        self.augment = augment
        self.seed = seed
        self.pixel_ops_on_device = pixel_ops_on_device
        self.geometry_on_device = geometry_on_device  # mosaic and affine in the step (implies the pixel ops there)
        self.albumentations = build_albumentations(augment.albumentations) if augment else None
        self.image_cache = image_cache  # set by detector.data.build once filled (detector/data/ram_cache.py)
        # Each image's canvas (height, width) when batches are rectangular (with_canvases); None: the square.
        self.canvas_hw: np.ndarray | None = None

    def with_canvases(self, canvas_hw: np.ndarray) -> DetectionDataset:
        """This dataset putting image ``i`` on ``canvas_hw[i]`` (height, width) instead of the square
        (:func:`detector.data.letterbox.rect_batches`): an evaluation item letterboxed into it, a training item
        (``--rect``) warped into it by the random affine. A shallow copy: records and cache are shared.

        Raises:
            ValueError: a training dataset that mixes images (mosaic, MixUp, CutMix) or warps on the device: a
                rectangular item is one image, warped in the workers (as Ultralytics' rect=True has it).
        """
        config = self.augment
        if config is not None and (config.mosaic > 0 or config.mixup > 0 or config.cutmix > 0
                                   or self.geometry_on_device):
            raise ValueError("rectangular training batches take no mosaic, MixUp or CutMix, and warp in the loader "
                             "workers (not --pixel-augment device)")
        view = copy.copy(self)
        view.canvas_hw = canvas_hw
        return view

    def canvas(self, index: int) -> tuple[int, int]:
        """The (height, width) item ``index`` is letterboxed (evaluation) or warped (training) into."""
        if self.canvas_hw is None:
            return self.image_size, self.image_size
        height, width = self.canvas_hw[index]
        return int(height), int(width)

    def __len__(self) -> int:
        return len(self.records)

    def load_resized(self, index: int) -> tuple[np.ndarray, tuple[int, int]]:
        """Image with its long side at ``image_size``, and its original (h, w)."""
        path = self.records.path(index)
        try:
            image = read_image_rgb(path)
        except READ_ERRORS as error:
            raise UnreadableImage(str(path), error) from None
        height, width = image.shape[:2]
        ratio = self.image_size / max(height, width)
        if ratio != 1:
            # >= 1 pixel a side, as the RAM cache sizes it (ram_cache.resized_shapes): a 4000x1 strip stays 640x1.
            # Bilinear either way, as predict's letterbox: an evaluation item is the pixels predict makes of the file.
            size = (max(1, round(width * ratio)), max(1, round(height * ratio)))
            image = cv2.resize(image, size, interpolation=RESIZE_INTERPOLATION)
        return image, (height, width)

    def load(self, index: int) -> tuple[np.ndarray, tuple[int, int]]:
        """The image resized for training, from the RAM cache when there is one, and its original (h, w)."""
        cache = self.image_cache
        if cache is not None and not cache.unreadable[index]:
            height, width = self.records.image_hw[index]
            return cache.image(index), (int(height), int(width))
        return self.load_resized(index)

    def _image_and_boxes(self, index: int, image: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Resized image (``image`` when already loaded), its boxes as xyxy pixels, and their classes."""
        if image is None:
            image, _ = self.load(index)
        height, width = image.shape[:2]
        labels = self.records.labels_of(index)
        scale = np.array([width, height, width, height], labels.dtype)
        # NumPy, not boxes.cxcywh_to_xyxy's torch ops: the same arithmetic, at a tenth of the per-call cost on
        # these few boxes (four calls per mosaic item, every item of every epoch).
        centres, half = labels[:, 1:3], labels[:, 3:5] / 2
        boxes = np.concatenate((centres - half, centres + half), 1) * scale
        return image, boxes.astype(np.float32).reshape(-1, 4), labels[:, 0].copy()

    def _train_item(
        self, index: int, epoch: int, use_mosaic: bool, stream: int, out_hw: tuple[int, int]
    ) -> tuple[np.ndarray | WarpSource, np.ndarray, np.ndarray, PixelOps | None]:
        """Image (or what the step warps into one), xyxy pixel boxes, classes, and the pixel operations left to
        the device (None: all applied); ``stream`` names the random draws (the sampler's key: ``index`` itself, or
        past the dataset's size for a padded batch's repeat of it, see :class:`~detector.data.sampler.EpochSampler`);
        ``out_hw``: the output, the ``image_size`` square or a ``--rect`` batch's canvas."""
        config, size = self.augment, self.image_size
        assert config is not None
        # Augmentation is a pure function of (seed, epoch, index): the same with any number of workers,
        # and a resumed run replays exactly what an uninterrupted one would have drawn. All three paths
        # draw the same numbers in the same order, so their geometry and boxes are identical.
        rng = np.random.default_rng((self.seed, epoch, stream))
        tiles, height, width, matrix, boxes, classes = self._geometry(index, rng, use_mosaic, out_hw)
        # MixUp (Ultralytics' mixup, off in close-mosaic epochs as there): this image blended with a second one of
        # its own geometry, drawn from a stream of its own; nothing is drawn at 0, so other draws stay as they were.
        image = None  # the item's pixels, once a second image is mixed into them here
        if use_mosaic and config.mixup > 0 and rng.random() < config.mixup:
            partner, ratio = int(rng.integers(0, len(self.records))), float(rng.beta(32.0, 32.0))
            other = self._geometry(partner, np.random.default_rng((self.seed, epoch, stream, 1)), use_mosaic, out_hw)
            image = mixup(warp_image(canvas(tiles, height, width), matrix, out_hw),
                          warp_image(canvas(*other[:3]), other[3], out_hw), ratio)
            boxes, classes = np.concatenate((boxes, other[4])), np.concatenate((classes, other[5]))
        # CutMix (Ultralytics' cutmix, after MixUp and off in close-mosaic epochs as there): a rectangle of a second
        # image pasted in, its partner's geometry on a stream of its own; nothing is drawn at 0 either.
        cut = self._cutmix(rng, boxes, epoch, stream, out_hw) if (
            use_mosaic and config.cutmix > 0 and rng.random() < config.cutmix) else None
        if cut is not None:
            rectangle, pixels, pasted, pasted_classes = cut
            first = warp_image(canvas(tiles, height, width), matrix, out_hw) if image is None else image
            image = paste_rectangle(first, pixels, rectangle)
            boxes, classes = np.concatenate((boxes, pasted)), np.concatenate((classes, pasted_classes))
        if image is None and self.geometry_on_device and is_affine(matrix):
            image = canvas_region(tiles, height, width, matrix, size)  # views of the tiles' parts it covers
            if self.image_cache is None:  # views would keep each decoded image whole until collate
                image = image.compact()
        else:
            if image is None:  # the device warp is affine: a perspective term (--perspective) is warped here
                image = warp_image(canvas(tiles, height, width), matrix, out_hw)
            if self.geometry_on_device:  # a mix or a perspective warp made here; the step's warp copies it as it is
                image = WarpSource.of_pixels(image, np.eye(3), size)
        # Here HSV, then albumentations; Ultralytics 8.4 runs albumentations first (augment.py v8_transforms), as the
        # device paths do. Kept: its blur, median blur, gray and CLAHE are drawn 1% each, so the order changes few
        # items, and only their pixels: the draws, and so the boxes, are the same either way.
        hsv = draw_hsv(config, rng)
        pixels_on_device = self.pixel_ops_on_device or self.geometry_on_device
        if not pixels_on_device:
            image = augment_hsv(image, hsv)
        if self.albumentations is not None:
            # On the device paths these (blur, median blur, gray, CLAHE; rare) see the image before HSV, not
            # after; with the geometry there too, they see the source region before the warp.
            drawn = self.albumentations.draw(rng)
            if drawn and isinstance(image, WarpSource):
                image = WarpSource.of_pixels(self.albumentations.apply(image.region, drawn), image.to_region, size)
            elif drawn:
                image = self.albumentations.apply(image, drawn)
        flip_lr, flip_ud = draw_flips(config, rng)
        boxes = flip_boxes(boxes, out_hw[1], out_hw[0], flip_lr=flip_lr, flip_ud=flip_ud)
        # The channel swap (--bgr) last, as Ultralytics' Format: it changes no box, and at 0 nothing is drawn.
        swap = draw_channel_swap(config, rng)
        if pixels_on_device:
            return image, boxes, classes, PixelOps(*hsv, flip_lr=flip_lr, flip_ud=flip_ud, swap_channels=swap)
        return swap_channels(flip_image(image, flip_lr=flip_lr, flip_ud=flip_ud), swap), boxes, classes, None

    def _cutmix(self, rng: np.random.Generator, boxes: np.ndarray, epoch: int, stream: int,
                out_hw: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """CutMix's draws for an item of ``boxes`` (:mod:`detector.data.cutmix`): its rectangle, the partner's
        warped pixels, and the partner's boxes and classes the rectangle brings; None when it brings none."""
        partner = int(rng.integers(0, len(self.records)))
        rectangle = choose_rectangle(rng, draw_rectangles(rng, *out_hw), boxes)
        if rectangle is None:  # every candidate covers a box: the item is left as it is
            return None
        tiles, height, width, matrix, other_boxes, other_classes = self._geometry(
            partner, np.random.default_rng((self.seed, epoch, stream, 2)), True, out_hw)
        pasted, pasted_classes = boxes_inside(rectangle, other_boxes, other_classes)
        if len(pasted) == 0:
            return None
        return rectangle, warp_image(canvas(tiles, height, width), matrix, out_hw), pasted, pasted_classes

    def _geometry(self, index: int, rng: np.random.Generator, use_mosaic: bool, out_hw: tuple[int, int]) -> tuple:
        """An item's canvas before its warp, as ``(tiles, height, width, matrix, boxes, classes)``: a mosaic of it
        and three others (when drawn) or the image alone, the random affine ``matrix`` drawn for it (into
        ``out_hw``), and the boxes and classes already warped by it."""
        config, size = self.augment, self.image_size
        assert config is not None
        if use_mosaic and rng.random() < config.mosaic:
            picks = [index, *rng.integers(0, len(self.records), 3)]
            images, boxes, classes = zip(*(self._image_and_boxes(int(i)) for i in picks))
            placements = mosaic_placements([image.shape[:2] for image in images], size, rng)
            tiles, (height, width) = mosaic_tiles(list(images), placements), (2 * size, 2 * size)
            boxes, classes = mosaic_boxes(placements, list(boxes), list(classes), size)
        else:
            image, boxes, classes = self._image_and_boxes(index)
            tiles, (height, width) = [(image, 0, 0)], image.shape[:2]
        matrix, zoom = affine_matrix(height, width, out_hw, config, rng)
        boxes, classes = warp_boxes(boxes, classes, matrix, zoom, out_hw)
        return tiles, height, width, matrix, boxes, classes

    def __getitem__(self, key: int | tuple[int, int, bool]) -> tuple[torch.Tensor, torch.Tensor, ImageMeta]:
        """``key`` is an index (evaluation) or ``(index, epoch, use_mosaic)`` from :class:`EpochSampler`.

        An image that fails to decode never stops the run: in training the item is drawn again from the next
        index (its mosaic partners too), in evaluation the image is scored as a blank one of its recorded size
        (its ground truth then counts as missed). Either way one warning names the file, and the item's
        ``meta.unreadable`` carries the path so the training loop can count it.
        """
        index, epoch, use_mosaic = key if isinstance(key, tuple) else (key, 0, False)
        out_hw = self.canvas(index % len(self))  # a replacement image goes on the canvas of the batch it is in
        failed = ""
        for attempt in range(MAX_REPLACEMENTS):
            try:
                image, boxes, classes, meta = self._item((index + attempt) % len(self), epoch, use_mosaic,
                                                         stream=index + attempt, out_hw=out_hw)
                break
            except UnreadableImage as error:
                warnings.warn(f"{error}; {'replaced by another image' if self.augment else 'scored blank'}",
                              stacklevel=2)
                failed = failed or error.path
                if self.augment is None:
                    image, boxes, classes, meta = self._blank_item(index)
                    break
        else:
            raise DatasetError(f"{MAX_REPLACEMENTS} images in a row failed to decode, from {failed}")
        if failed:
            meta = dataclasses.replace(meta, unreadable=failed)
        # Labels are normalised by the item's canvas: the square, or its rectangular batch's.
        height, width = out_hw
        scale = np.array([width, height], np.float32)
        centres = (boxes[:, :2] + boxes[:, 2:]) / 2 / scale
        sides = (boxes[:, 2:] - boxes[:, :2]) / scale
        labels = np.concatenate((classes[:, None], centres, sides), 1).astype(np.float32)
        # A [3, S, S] view of the HWC pixels, no copy: collate stacks them straight into channels-last.
        image_chw = image if isinstance(image, WarpSource) else torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
        return image_chw, torch.from_numpy(labels), meta

    def _item(self, index: int, epoch: int, use_mosaic: bool, stream: int,
              out_hw: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, ImageMeta]:
        """Image, xyxy pixel boxes, classes and meta of one item, before conversion to tensors; ``stream``: its random
        draws' key (:meth:`_train_item`); ``out_hw``: its canvas (:meth:`canvas`)."""
        image_id = int(self.records.image_ids[index])
        if self.augment is not None:
            image, boxes, classes, pixel_ops = self._train_item(index, epoch, use_mosaic, stream, out_hw)
            return image, boxes, classes, ImageMeta(image_id, out_hw, 1.0, (0.0, 0.0), pixel_ops)
        resized, original_hw = self.load(index)
        # ``shrink`` is 1 unless the image no longer fits the canvas its recorded size gave (see letterbox).
        image, shrink, pad = letterbox(resized, self.image_size, out_hw)
        ratio = self.image_size / max(original_hw) * shrink
        _, boxes, classes = self._image_and_boxes(index, resized)
        boxes = boxes * np.float32(shrink) + np.array(pad * 2, np.float32)
        return image, boxes, classes, ImageMeta(image_id, original_hw, ratio, pad,
                                                resized_hw=resized_size(*resized.shape[:2], shrink))

    def _blank_item(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, ImageMeta]:
        """A mid-gray letterboxed image standing in for an unreadable one in evaluation, with no boxes."""
        height, width = (int(v) for v in self.records.image_hw[index])
        ratio = self.image_size / max(height, width)
        resized = np.full((max(round(height * ratio), 1), max(round(width * ratio), 1), 3), PAD_VALUE, np.uint8)
        image, shrink, pad = letterbox(resized, self.image_size, self.canvas(index))
        meta = ImageMeta(int(self.records.image_ids[index]), (height, width), ratio * shrink, pad,
                         resized_hw=resized_size(*resized.shape[:2], shrink))
        return image, np.zeros((0, 4), np.float32), np.zeros(0, np.float32), meta


def canvas(tiles: list, height: int, width: int) -> np.ndarray:
    """The canvas the tiles make: one tile at the origin is the canvas itself (no copy), more are pasted."""
    return tiles[0][0] if len(tiles) == 1 else paste(tiles, height, width)


def mixup(first: np.ndarray, second: np.ndarray, ratio: float) -> np.ndarray:
    """``first * ratio + second * (1 - ratio)``, truncated to uint8, as Ultralytics' MixUp blends."""
    return (first.astype(np.float32) * ratio + second.astype(np.float32) * (1 - ratio)).astype(np.uint8)


def collate(
    batch: list[tuple[torch.Tensor | WarpSource, torch.Tensor, ImageMeta]],
) -> tuple[torch.Tensor | WarpBatch, torch.Tensor, list[ImageMeta]]:
    """-> images ``uint8 [B, 3, H, W]`` (``S x S`` but in rectangular batches: evaluation's, and ``--rect``
    training's, one canvas a batch), targets ``[N, 6]`` (image index, class, cx, cy, w, h), metas.

    The images come out in channels-last memory (the decoder's HWC order), the layout the model trains
    in, so the training step needs no transposing copy of the batch. Items whose geometry is left to the
    device (:class:`WarpSource`) come out as one :class:`WarpBatch` instead, which the step renders.
    """
    images, labels, metas = zip(*batch)
    targets = [torch.cat((torch.full((len(l), 1), i, dtype=torch.float32), l), 1) for i, l in enumerate(labels)]
    if isinstance(images[0], WarpSource):
        return pack_warp_batch(images), torch.cat(targets), list(metas)
    hwc = [image.permute(1, 2, 0) for image in images]
    pixels = torch.stack(hwc, out=batch_tensor((len(hwc), *hwc[0].shape), hwc[0].dtype)).permute(0, 3, 1, 2)
    return pixels, torch.cat(targets), list(metas)
