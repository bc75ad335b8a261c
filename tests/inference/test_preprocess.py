"""The letterbox on the device (CUDA's pre-process) against OpenCV's, run here on the CPU."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch

from detector.data.letterbox import ImageMeta, unletterbox_boxes
from detector.inference import preprocess
from detector.inference.preprocess import batch_to_original_pixels, letterbox_on_device, prepare_batch


# (1, 4000): a strip whose short side scales below half a pixel, kept at one (it crashed the resize).
@pytest.mark.parametrize("shape", [(480, 640), (640, 360), (100, 100), (64, 64), (1, 4000)])
def test_device_letterbox_matches_opencv(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (*shape, 3), dtype=np.uint8), rng.integers(0, 256, (shape[1], shape[0], 3),
                                                                             dtype=np.uint8)]
    expected, expected_meta = prepare_batch(images, 64)
    got, got_meta = letterbox_on_device(images, 64, torch.device("cpu"))
    assert got.dtype == torch.uint8 and got.shape == expected.shape == (2, 3, 64, 64)
    assert got_meta == expected_meta
    # OpenCV rounds its bilinear weights to 11 bits; the float resize does not: one grey level apart at most.
    assert int((got.int() - expected.int()).abs().max()) <= 1



@pytest.mark.parametrize("group_bytes", [256 << 20, 12 * 48 * 80 * 2])  # all of a shape at once; two per call
def test_images_of_one_shape_go_together_and_come_out_as_one_at_a_time(group_bytes: int, monkeypatch) -> None:
    """A batch of two shapes, interleaved, one of them a strided view (as a BGR->RGB flip of a frame gives), one
    read-only, one a crop: each image comes out in its own place and to the bit as when it goes through alone,
    also when a shape's images are more than one call's memory budget holds, and as OpenCV's letterbox places it."""
    monkeypatch.setattr(preprocess, "GROUP_BYTES", group_bytes)
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, (48, 80, 3), dtype=np.uint8) for _ in range(4)]
    portrait = rng.integers(0, 256, (70, 30, 3), dtype=np.uint8)
    locked = frames[3].copy()
    locked.setflags(write=False)  # a frame in read-only memory (np.frombuffer over bytes gives one)
    crop = rng.integers(0, 256, (48, 90, 3), dtype=np.uint8)[:, 5:85]  # a strided view, no negative stride
    images = [frames[0], portrait, frames[1][..., ::-1], frames[2], portrait[::-1], locked, crop]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it views a read-only array: it must not
        batch, metas = letterbox_on_device(images, 64, torch.device("cpu"))
    assert [meta.image_id for meta in metas] == list(range(len(images)))
    expected, _ = prepare_batch(images, 64)  # OpenCV's: one grey level apart at most (see above)
    assert int((batch.int() - expected.int()).abs().max()) <= 1
    for index, image in enumerate(images):
        alone, (meta,) = letterbox_on_device([image], 64, torch.device("cpu"))
        assert torch.equal(batch[index], alone[0]) and metas[index] == replace(meta, image_id=index)
    assert not torch.equal(batch[0], batch[3])

@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device letterbox is for CUDA")
def test_prepare_batch_on_cuda_returns_a_gpu_batch() -> None:
    image = np.full((48, 64, 3), 200, np.uint8)
    batch, _ = prepare_batch([image], 64, device="cuda")
    cpu_batch, _ = prepare_batch([image], 64)
    assert batch.is_cuda and torch.equal(batch.cpu(), cpu_batch)



@pytest.mark.skipif(not torch.cuda.is_available(), reason="the pinned upload is for CUDA")
def test_repeated_mixed_batches_on_cuda_match_the_cpu() -> None:
    """Batches of mixed shapes and random pixels, one after another, so a pinned buffer freed by one call is
    reused by the next while its copy may still be in flight: each batch equals the CPU's within one grey level
    (CUDA's and the CPU's FP32 bilinear sums may round apart)."""
    rng = np.random.default_rng(2)
    for _ in range(4):
        shapes = [(48, 80), (70, 30), (48, 80), (64, 64), (33, 97)]
        images = [rng.integers(0, 256, (*shape, 3), dtype=np.uint8) for shape in shapes]
        got, got_meta = letterbox_on_device(images, 64, torch.device("cuda"))
        expected, expected_meta = letterbox_on_device(images, 64, torch.device("cpu"))
        assert got.is_cuda and got_meta == expected_meta
        assert int((got.cpu().int() - expected.int()).abs().max()) <= 1

def test_a_tight_batch_pads_only_to_the_stride_and_maps_back() -> None:
    from detector.inference.preprocess import to_original_pixels

    photo = np.zeros((480, 640, 3), np.uint8)
    batch, (meta,) = prepare_batch([photo], 640, tight=32)
    assert batch.shape == (1, 3, 480, 640) and meta.pad == (0.0, 0.0) and meta.ratio == 1.0
    batch, (meta,) = prepare_batch([np.zeros((500, 640, 3), np.uint8)], 640, tight=32)  # 500 rows -> 512
    assert batch.shape == (1, 3, 512, 640) and meta.pad == (0.0, 6.0)
    back = to_original_pixels({"boxes": torch.tensor([[10.0, 16.0, 50.0, 106.0]])}, meta)["boxes"]
    assert torch.equal(back, torch.tensor([[10.0, 10.0, 50.0, 100.0]]))
    mixed, _ = prepare_batch([photo, np.zeros((640, 480, 3), np.uint8)], 640, tight=32)
    assert mixed.shape == (2, 3, 640, 640)  # landscape with portrait: one square canvas holds both
    assert prepare_batch([photo], 640)[0].shape == (1, 3, 640, 640)  # not asked: the square, as every export takes


def test_a_batch_goes_back_to_original_pixels_as_each_image_would() -> None:
    """One copy for the batch: the same boxes as the per-image undo (to the bit), scores and labels unchanged in
    their own dtypes, an image without detections kept, other fields carried over."""
    metas = [ImageMeta(0, (480, 640), 0.1, (0.0, 8.0)), ImageMeta(1, (64, 64), 1.0, (0.0, 0.0)),
             ImageMeta(2, (300, 200), 64 / 300, (11.0, 0.0))]
    generator = torch.Generator().manual_seed(0)
    detections = []
    for count in (3, 0, 2):
        corners = torch.rand(count, 2, 2, generator=generator) * 70 - 3
        detections.append({"boxes": torch.cat((corners.min(1).values, corners.max(1).values), 1),
                           "scores": torch.rand(count, generator=generator),
                           "labels": torch.randint(0, 80, (count,), generator=generator), "track": torch.arange(count)})
    back = batch_to_original_pixels(detections, metas)
    assert len(back) == 3 and len(back[1]["boxes"]) == 0
    for got, sent, meta in zip(back, detections, metas):
        assert list(got) == list(sent)  # the same fields in the same order
        assert torch.equal(got["boxes"], unletterbox_boxes(sent["boxes"], meta))
        for key in ("scores", "labels", "track"):
            assert got[key].dtype == sent[key].dtype and torch.equal(got[key], sent[key])
    assert batch_to_original_pixels([], []) == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_input_holds_what_autocast_would_cast_the_fp32_one_to(dtype):
    """Every uint8 value: made in half precision directly, the batch is the FP32 input rounded once, as autocast's
    cast of it for the first convolution (on a GPU the division computes in FP32 the same way)."""
    from detector.inference.preprocess import model_input

    images = torch.arange(256, dtype=torch.uint8).repeat(3, 1).reshape(1, 3, 16, 16)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    made = model_input(images, device, channels_last=True, dtype=dtype)
    assert made.dtype == dtype and made.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(made, model_input(images, device, channels_last=True).to(dtype))
