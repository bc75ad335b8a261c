"""detector/defaults.py: the defaults ``--help`` prints are the ones the code uses."""

from __future__ import annotations

import inspect

from detector import defaults


def test_the_exporters_take_their_defaults_from_here() -> None:
    from detector.exporting.onnx import export_onnx
    from detector.exporting.parity import check_parity
    from detector.exporting.tensorrt import build_engine
    from detector.exporting.wrapper import EXPORT_NMS

    assert inspect.signature(export_onnx).parameters["opset"].default == defaults.DEFAULT_OPSET
    assert inspect.signature(build_engine).parameters["workspace_gib"].default == defaults.DEFAULT_WORKSPACE_GIB
    assert inspect.signature(check_parity).parameters["score_tolerance"].default == defaults.SCORE_TOLERANCE
    assert (EXPORT_NMS.conf_threshold, EXPORT_NMS.iou_threshold, EXPORT_NMS.max_detections) == (
        defaults.EXPORT_CONF, defaults.EXPORT_IOU, defaults.EXPORT_MAX_DET)
