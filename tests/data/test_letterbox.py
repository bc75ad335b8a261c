"""The letterbox to a square or to a rectangular batch's canvas, and the rectangular evaluation batches."""

from __future__ import annotations

import numpy as np
import torch

from detector.data.letterbox import ImageMeta, letterbox, rect_batches, unletterbox_boxes

MULTIPLE = 32


def test_letterbox_to_a_canvas_centres_the_image_and_the_undo_maps_back():
    image = np.zeros((480, 640, 3), np.uint8)
    boxed, ratio, pad = letterbox(image, 320, (256, 320))  # 240 x 320 after resizing, 8 px above and below
    assert boxed.shape == (256, 320, 3) and ratio == 0.5 and pad == (0.0, 8.0)
    assert (boxed[:8] == 114).all() and (boxed[-8:] == 114).all() and (boxed[8:-8] == 0).all()
    meta = ImageMeta(0, (480, 640), ratio, pad)
    back = unletterbox_boxes(torch.tensor([[10.0, 18.0, 110.0, 58.0]]), meta)
    assert torch.equal(back, torch.tensor([[20.0, 20.0, 220.0, 100.0]]))


def test_rect_batches_pad_each_batch_only_as_far_as_its_images_need():
    # (height, width): landscape 360x640 and 480x640, a square, portrait 640x480.
    image_hw = np.array([[640, 480], [480, 640], [500, 500], [360, 640], [480, 640], [640, 480], [480, 640]])
    order, canvases = rect_batches(image_hw, 640, batch=3, multiple=MULTIPLE)
    aspect = image_hw[:, 0] / image_hw[:, 1]
    assert sorted(order.tolist()) == list(range(7)) and (np.diff(aspect[order]) >= 0).all()
    batches = [order[start:start + 3] for start in range(0, 7, 3)]
    assert [tuple(canvases[batch[0]]) for batch in batches] == [(480, 640), (640, 640), (640, 480)]
    for batch in batches:  # one canvas per batch: the loader stacks them
        assert (canvases[batch] == canvases[batch[0]]).all()


def test_every_image_fits_its_canvas_at_the_square_letterboxs_scale():
    rng = np.random.default_rng(0)
    image_hw = rng.integers(1, 2000, size=(500, 2))
    for size in (160, 320, 640):
        order, canvases = rect_batches(image_hw, size, batch=16, multiple=MULTIPLE)
        assert (canvases % MULTIPLE == 0).all() and (canvases <= size).all() and (canvases > 0).all()
        for index in order[:200]:
            height, width = image_hw[index]
            boxed, ratio, _ = letterbox(np.zeros((height, width, 3), np.uint8), size, tuple(canvases[index]))
            assert boxed.shape[:2] == tuple(canvases[index]) and ratio == size / max(height, width)
