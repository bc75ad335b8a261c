"""The letterbox to a square or to a rectangular batch's canvas, and the rectangular evaluation batches."""

from __future__ import annotations

import numpy as np
import torch

from detector.data.letterbox import ImageMeta, letterbox, rect_batches, unletterbox_boxes, unletterbox_rows

MULTIPLE = 32


def test_letterbox_to_a_canvas_centres_the_image_and_the_undo_maps_back():
    image = np.zeros((480, 640, 3), np.uint8)
    boxed, ratio, pad = letterbox(image, 320, (256, 320))  # 240 x 320 after resizing, 8 px above and below
    assert boxed.shape == (256, 320, 3) and ratio == 0.5 and pad == (0.0, 8.0)
    assert (boxed[:8] == 114).all() and (boxed[-8:] == 114).all() and (boxed[8:-8] == 0).all()
    meta = ImageMeta(0, (480, 640), ratio, pad)
    back = unletterbox_boxes(torch.tensor([[10.0, 18.0, 110.0, 58.0]]), meta)
    assert torch.equal(back, torch.tensor([[20.0, 20.0, 220.0, 100.0]]))



def test_a_strip_one_pixel_high_keeps_one_row():
    # 4000x1 at 640: 0.16 of a row, which rounded to none and made cv2.resize raise (predict and val stopped).
    boxed, ratio, pad = letterbox(np.full((1, 4000, 3), 200, np.uint8), 640)
    assert boxed.shape == (640, 640, 3) and ratio == 640 / 4000 and pad == (0.0, 319.0)
    assert (boxed[319] == 200).all() and (boxed[318] == 114).all() and (boxed[320] == 114).all()


def test_a_batch_maps_back_as_each_image_would_on_its_own():
    """unletterbox_rows over three images (one without boxes) against the per-image arithmetic written out with
    Python floats, as the per-image undo was written before: equal to the bit, clipping included."""
    metas = [ImageMeta(0, (480, 640), 0.5, (0.0, 40.0)), ImageMeta(1, (300, 200), 320 / 300, (53.0, 0.0)),
             ImageMeta(2, (100, 100), 3.2, (0.0, 0.0)), ImageMeta(3, (7, 9), 1 / 3, (1.0, 2.0))]
    counts = [5, 0, 4, 3]
    generator = torch.Generator().manual_seed(0)
    corners = torch.rand(sum(counts), 2, 2, generator=generator) * 360 - 20  # some outside the image: clipped
    boxes = torch.cat((corners.min(1).values, corners.max(1).values), 1)
    expected = []
    for meta, rows in zip(metas, boxes.split(counts)):
        rows = rows.clone()
        height, width = meta.original_hw
        rows[:, [0, 2]] = ((rows[:, [0, 2]] - meta.pad[0]) / meta.ratio).clamp(0, width)
        rows[:, [1, 3]] = ((rows[:, [1, 3]] - meta.pad[1]) / meta.ratio).clamp(0, height)
        expected.append(rows)
    got = unletterbox_rows(boxes, metas, counts)
    assert got.dtype == torch.float32 and torch.equal(got, torch.cat(expected))
    assert (got[:, 0] < got[:, 2]).any()  # not all clipped flat: the test would pass on zeros otherwise
    assert torch.equal(unletterbox_boxes(boxes[:5], metas[0]), expected[0])
    assert unletterbox_rows(torch.zeros(0, 4), metas[:1], [0]).shape == (0, 4)

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
