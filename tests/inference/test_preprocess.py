"""The letterbox on the device (CUDA's pre-process) against OpenCV's, run here on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detector.inference.preprocess import letterbox_on_device, prepare_batch


@pytest.mark.parametrize("shape", [(480, 640), (640, 360), (100, 100), (64, 64)])
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device letterbox is for CUDA")
def test_prepare_batch_on_cuda_returns_a_gpu_batch() -> None:
    image = np.full((48, 64, 3), 200, np.uint8)
    batch, _ = prepare_batch([image], 64, device="cuda")
    cpu_batch, _ = prepare_batch([image], 64)
    assert batch.is_cuda and torch.equal(batch.cpu(), cpu_batch)


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
