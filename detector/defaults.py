"""The default values that a flag's help and the code behind the flag share, in a module that imports nothing.

The workflows' option dataclasses (detector/workflows/options.py) print these in ``--help`` without importing
torch; the module that acts on a value (an exporter, the parity check) takes its default from here too, so the
help cannot drift from what runs. As detector/choices.py is for the values an enumerated flag accepts.
"""

DEFAULT_IMGSZ = 640  # input pixels when neither --imgsz nor the checkpoint's training size gives one

# export
DEFAULT_OPSET = 17  # --opset: 9 and later export (--nms: 11); 17 is read by TensorRT 8.6 and later
DEFAULT_WORKSPACE_GIB = 4.0  # --workspace: memory TensorRT's builder may use for its tactics
EXPORT_CONF = 0.25  # --conf: with --nms, the score threshold baked into the graph
EXPORT_IOU = 0.7  # --iou: with --nms, the IoU threshold baked into the graph
EXPORT_MAX_DET = 300  # --max-det: with --nms, K, the detections per image the graph outputs
# --score-tol: without a dataset there is no mAP; a score off by more than this means a broken export, not
# rounding (FP16 moves sigmoid scores by ~1e-3 on trained models).
SCORE_TOLERANCE = 0.05
