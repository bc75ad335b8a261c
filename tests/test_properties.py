"""Property-based tests (hypothesis) for label parsing and box conversions."""

import numpy as np
import pytest
import torch

pytest.importorskip("hypothesis", reason="property-based tests need hypothesis (the 'dev' extra)")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from detector.boxes import boxes_to_distances, cxcywh_to_xyxy, distances_to_boxes, xyxy_to_cxcywh
from detector.data.labels import parse_yolo_label_text

coordinate = st.floats(min_value=-0.5, max_value=1.5, allow_nan=False, width=32)
line = st.one_of(
    st.tuples(st.integers(-2, 6), coordinate, coordinate, coordinate, coordinate).map(lambda v: " ".join(map(str, v))),
    st.text(alphabet="0123456789.- abcnaif", max_size=30),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(line, max_size=12))
def test_parsed_labels_are_always_valid(lines):
    labels, problems = parse_yolo_label_text("\n".join(lines), num_classes=4, source="p.txt")
    assert labels.dtype == np.float32 and labels.shape[1] == 5
    if len(labels):
        assert set(np.unique(labels[:, 0])) <= {0.0, 1.0, 2.0, 3.0}
        x1y1, x2y2 = labels[:, 1:3] - labels[:, 3:5] / 2, labels[:, 1:3] + labels[:, 3:5] / 2
        assert x1y1.min() >= -1e-5 and x2y2.max() <= 1 + 1e-5 and (labels[:, 3:5] > 0).all()
        assert len(np.unique(labels, axis=0)) == len(labels)
    assert all(where.startswith("p.txt") and count > 0 for _, where, count in problems.entries)


box = st.tuples(*[st.floats(0, 500, allow_nan=False, width=32)] * 2, *[st.floats(1, 300, allow_nan=False, width=32)] * 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(box, min_size=1, max_size=8))
def test_box_conversions_round_trip(values):
    xywh = torch.tensor(values, dtype=torch.float64)
    xyxy = torch.cat((xywh[:, :2], xywh[:, :2] + xywh[:, 2:]), 1)
    torch.testing.assert_close(cxcywh_to_xyxy(xyxy_to_cxcywh(xyxy)), xyxy)
    centres = (xyxy[:, :2] + xyxy[:, 2:]) / 2  # a point inside each box
    torch.testing.assert_close(distances_to_boxes(centres, boxes_to_distances(centres, xyxy, 1e9)), xyxy)
