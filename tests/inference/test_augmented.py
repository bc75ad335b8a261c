"""Test-time augmentation: each view's boxes land back on the input's pixels, each view drops the level Ultralytics
drops, the views and the merge are Ultralytics' own (its ``scale_img``, ``_descale_pred``, ``_clip_augmented`` in
a child process: importing it patches this one), and exports that cannot run it say why."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detector.inference.augmented import (
    VIEWS, AugmentedBackend, augmented, level_anchor_counts, make_views, merge_views,
)
from detector.inference.backend import Backend, RawOutputs
from detector.model.metadata import ModelInfo
from detector.postprocess import NMSConfig

STRIDES = (8, 16, 32)
HEIGHT, WIDTH = 96, 128  # multiples of the largest stride, unequal so that a swapped side would show
SQUARE = (40, 24, 72, 56)  # x1, y1, x2, y2 of a white square on black


def square_image() -> torch.Tensor:
    image = torch.zeros(1, 3, HEIGHT, WIDTH, dtype=torch.uint8)
    x1, y1, x2, y2 = SQUARE
    image[..., y1:y2, x1:x2] = 255
    return image


def fake_forward(view: torch.Tensor) -> torch.Tensor:
    """A 'model' that sees the white square perfectly: every anchor of the view's levels predicts the square's box
    in the view's pixels (pixel edges of the pixels brighter than half), score 1, and its level as a second class
    score, so the merge's choice of levels shows."""
    bright = view[0, 0] > 127
    rows, cols = bright.any(1).nonzero().flatten(), bright.any(0).nonzero().flatten()
    box = torch.tensor([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1], dtype=torch.float32)
    counts = level_anchor_counts(*view.shape[2:], STRIDES)
    level = torch.cat([torch.full((count,), float(index)) for index, count in enumerate(counts)])
    rows_out = torch.cat((box.expand(len(level), 4), torch.ones(len(level), 1), level[:, None]), 1)
    return rows_out.expand(view.shape[0], -1, -1)


def test_every_views_boxes_map_back_to_the_inputs_pixels():
    merged = augmented(fake_forward, square_image(), STRIDES)
    # Tolerance: a view's square edge lands within 1 px of the exact scaled edge (the bilinear resize blurs one
    # pixel across the half-grey threshold), and the view's size is truncated (int(side * scale): < 1 px short), so
    # within 2 view pixels, 2 / 0.67 = 3 input pixels after the division by the scale. The flip is exact.
    tolerance = 2 / min(scale for scale, _ in VIEWS)
    assert torch.allclose(merged[0, :, :4], torch.tensor(SQUARE, dtype=torch.float32).expand_as(merged[0, :, :4]),
                          atol=tolerance)


def test_each_view_keeps_the_levels_its_scale_sees_best():
    views = make_views(square_image(), max(STRIDES))
    assert [tuple(view.images.shape[2:]) for view in views] == [(96, 128), (96, 128), (96, 96)]  # padded up to 32
    assert [(view.scale, view.flipped) for view in views] == list(VIEWS)
    outputs = [fake_forward(view.images) for view in views]
    merged = merge_views(outputs, views, WIDTH, STRIDES)
    counts = [level_anchor_counts(*view.images.shape[2:], STRIDES) for view in views]
    # The full-size view without its coarsest level (largest objects), the smallest without its finest.
    expected_levels = ([0] * counts[0][0] + [1] * counts[0][1] + [0] * counts[1][0] + [1] * counts[1][1]
                       + [2] * counts[1][2] + [1] * counts[2][1] + [2] * counts[2][2])
    assert merged[0, :, 5].tolist() == expected_levels
    with pytest.raises(ValueError, match=r"a view of \(96, 96\) px gave 10 boxes; its levels \(strides \(8, 16, 32\)\) "
                                         r"have 189"):
        merge_views([*outputs[:2], outputs[2][:, :10]], views, WIDTH, STRIDES)


# The child: Ultralytics' views of the same images and its merge of the same outputs (xywh, [B, 4 + C, A]).
ORACLE = """
import sys, types
import torch
from ultralytics.nn.tasks import DetectionModel
from ultralytics.utils.torch_utils import scale_img

case = torch.load(sys.argv[1])
images, outputs = case["images"].float() / 255, case["outputs"]
views, descaled = [], []
for (scale, flipped), output in zip(case["views"], outputs):
    views.append(scale_img(images.flip(3) if flipped else images, scale, gs=32))
    descaled.append(DetectionModel._descale_pred(output.clone(), 3 if flipped else None, scale, images.shape[2:]))
stub = types.SimpleNamespace(model=[types.SimpleNamespace(nl=3)])
merged = torch.cat(DetectionModel._clip_augmented(stub, descaled), -1)
torch.save({"views": views, "merged": merged}, sys.argv[2])
"""


def to_xywh_channels_first(rows: torch.Tensor) -> torch.Tensor:
    """Ours ``[B, A, 4 + C]`` xyxy -> Ultralytics' ``[B, 4 + C, A]`` xywh (centre, size)."""
    xy, wh = (rows[..., :2] + rows[..., 2:4]) / 2, rows[..., 2:4] - rows[..., :2]
    return torch.cat((xy, wh, rows[..., 4:]), -1).transpose(1, 2)


def test_the_views_and_the_merge_are_ultralytics(tmp_path: Path):
    if importlib.util.find_spec("ultralytics") is None:  # looked for, not imported (see the module docstring)
        pytest.skip("ultralytics (the dev extra) is not installed")
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (2, 3, HEIGHT, WIDTH), dtype=torch.uint8, generator=generator)
    views = make_views(images, max(STRIDES))
    outputs = []
    for view in views:  # random boxes with x1 < x2, y1 < y2 in the view, and random scores for 3 classes
        anchors = sum(level_anchor_counts(*view.images.shape[2:], STRIDES))
        corner = torch.rand(2, anchors, 2, generator=generator) * torch.tensor([WIDTH, HEIGHT]) * 0.6
        size = torch.rand(2, anchors, 2, generator=generator) * 40 + 1
        outputs.append(torch.cat((corner, corner + size, torch.rand(2, anchors, 3, generator=generator)), -1))
    ours = merge_views(outputs, views, WIDTH, STRIDES)
    torch.save({"images": images, "views": [(v.scale, v.flipped) for v in views],
                "outputs": [to_xywh_channels_first(output) for output in outputs]}, tmp_path / "case.pt")
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", ORACLE, str(tmp_path / "case.pt"), str(tmp_path / "theirs.pt")],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    theirs = torch.load(tmp_path / "theirs.pt")
    for view, their_view in zip(views, theirs["views"]):
        assert view.images.shape == their_view.shape
        # Ours is theirs rounded to a grey level: at most half of one apart (1/510), and their padding's 0.447 is
        # 113.985 grey levels where ours is 114; FP32 rounding of their interpolation adds ~1e-7.
        assert (view.images.float() / 255 - their_view).abs().max() <= 0.5 / 255 + 1e-6
    # The same boxes, the same anchors dropped: the same numbers up to FP32 rounding of the two layouts' corner and
    # centre arithmetic (a few ulps of 128 px, 1.5e-5 each; 1e-4 leaves room for the flip's subtraction too).
    torch.testing.assert_close(to_xywh_channels_first(ours), theirs["merged"], rtol=0, atol=1e-4)


class _Stub(Backend):
    def infer(self, images: torch.Tensor) -> RawOutputs:
        raise AssertionError("not run")


def test_exports_that_cannot_run_augmented_say_why():
    fixed = ModelInfo(names=["a"], strides=STRIDES, imgsz=640, dynamic=False)
    with pytest.raises(ValueError, match=r"^--augment runs smaller views of each image: this export takes 640 px alone "
                                         r"\(export with --dynamic, or use the .pt weights\)$"):
        AugmentedBackend(_Stub(fixed))
    baked = ModelInfo(names=["a"], strides=STRIDES, imgsz=640, dynamic=True, nms=NMSConfig())
    with pytest.raises(ValueError, match=r"^--augment needs the boxes before NMS: this export has NMS inside"):
        AugmentedBackend(_Stub(baked))


def test_an_augmented_backend_runs_the_backend_on_each_view_and_keeps_its_nms(checkpoint: Path):
    from detector.inference.torch_backend import TorchBackend

    plain = TorchBackend.from_checkpoint(checkpoint, imgsz=64, nms=NMSConfig(conf_threshold=0.0, max_detections=5))
    wrapped = AugmentedBackend(plain)
    images = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    boxes, scores = wrapped.infer(images)
    counts = [level_anchor_counts(*view.images.shape[2:], plain.info.strides) for view in make_views(images, 32)]
    assert boxes.shape[:2] == scores.shape[:2] == (2, sum(map(sum, counts)) - counts[0][-1] - counts[-1][0])
    # The first view is the batch itself: its anchors but the coarsest level's are the plain backend's own.
    plain_boxes, plain_scores = plain.infer(images)
    kept = sum(counts[0][:-1])
    assert torch.equal(boxes[:, :kept], plain_boxes[:, :kept]) and torch.equal(scores[:, :kept], plain_scores[:, :kept])
    assert [len(d["boxes"]) for d in wrapped(images)] == [5, 5]  # the wrapped backend's NMS settings
    assert wrapped.name == "pytorch fp32, augmented"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FP16 weights and CUDA graphs run on a GPU")
def test_augmented_fp16_cuda_graphs_match_the_cpu_s_fp32_views(model, checkpoint: Path):
    """On CUDA with --half each view's shape is a graph of its own, replayed on the next call;
    the detections are the CPU FP32 augmented pass's within FP16's rounding (as the plain backend's test bounds it)."""
    from detector.inference import load_backend
    from tests.tolerances import assert_same_detections, fp32_tolerance_on, rounded_relative_error

    nms = NMSConfig(conf_threshold=0.01)
    images = torch.randint(0, 256, (3, 3, 128, 128), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    fast = AugmentedBackend(load_backend(checkpoint, device="cuda", precision="fp16", nms=nms, imgsz=128))
    assert fast.name == "pytorch fp16 cuda graph, augmented"
    expected = AugmentedBackend(load_backend(checkpoint, nms=nms, imgsz=128))(images)
    first, again = fast(images), fast(images)
    assert len(fast.backend.forward.graphs) == 2  # 128 px (the batch, and its 0.83 view padded up to 128) and 96
    tolerance = fp32_tolerance_on(model, images, relative=rounded_relative_error(model, 2**-10))
    assert_same_detections(expected, first, nms=nms, tolerance=tolerance)
    for got, want in zip(again, first):
        assert all(torch.equal(got[key], want[key]) for key in ("boxes", "scores", "labels"))
