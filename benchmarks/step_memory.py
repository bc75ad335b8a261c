"""The tensor memory of one training step (forward, loss, backward) at GPU sizes, estimated on any machine.

Peak GPU memory is a target of issue 33 (at batch 64 within 1.1x Ultralytics'), and a GPU is not always at hand.
This runs the step's operators on fake tensors (``torch._subclasses.FakeTensorMode``: shapes and dtypes, no data,
no arithmetic) under PyTorch's memory tracker (``torch.distributed._tools.mem_tracker.MemTracker``, which follows
every tensor's storage from its creation to its release), so batch 64 at 704 px takes seconds on a laptop. The
model runs in ``--dtype`` (FP16 by default, as autocast runs a CUDA step's convolutions), channels-last; the loss in
FP32, as training runs it; the targets are ``--boxes`` boxes an image, padded to the training step's box slots.

    python benchmarks/step_memory.py                                     # nano, 3 classes, batch 64, 640 and 704 px
    python benchmarks/step_memory.py --classes 80 --boxes 60 --sizes 640

Counted: parameters, activations kept for the backward pass, the loss's temporaries, gradients. Not counted: the
optimizer's state and the EMA (a few MB for the nano model), the allocator's rounding and caching, cuDNN's
workspaces and kernels' own scratch memory, the input batch's own buffers: a measured peak is higher. The whole
model runs in ``--dtype``, where autocast keeps FP32 weights and gradients (and FP16 copies of the weights): those
are undercounted by half, a few MB for the nano model, more for ``--model x``. Compare rows, or two checkouts, not this
with a GPU's figure. Both tools are PyTorch's own but private modules: a version without them says so in one line.
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import sys

import torch

from detector.architecture import MODEL_NAMES, display_name
from detector.loss import DetectionLoss, box_slots, targets_to_padded
from detector.model import build_model

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def synthetic_targets(batch: int, boxes: int, classes: int) -> torch.Tensor:
    """``[batch * boxes, 6]`` rows spread over each image (a box's size 10-22% of the side), deterministic."""
    rows = [[image, j % classes, 0.1 + 0.08 * ((image * 7 + j * 3) % 10), 0.1 + 0.08 * ((image * 3 + j * 7) % 10),
             0.1 + 0.12 * (j % 2), 0.12 + 0.05 * (j % 3)] for image in range(batch) for j in range(boxes)]
    return torch.tensor(rows)


def step_memory(*, scale: str, classes: int, batch: int, size: int, boxes: int, dtype: torch.dtype,
                recompute: bool = True) -> dict:
    """MB of tensors alive after the forward pass and at the step's peak; ``recompute``: as training on CUDA does by
    default (``--recompute auto``), BatchNorm's outputs of the largest blocks recomputed in backward."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    model = build_model(num_classes=classes, scale=scale).train().to(dtype).to(memory_format=torch.channels_last)
    try:
        from detector.model.recompute import recompute_activations
    except ImportError:  # a checkout from before --recompute
        if recompute:
            print("note: this checkout has no --recompute; every activation is kept", file=sys.stderr)
    else:
        recompute_activations(model, recompute)
    for parameter in model.parameters():
        parameter.requires_grad_(True)  # the tracker hooks every parameter, the frozen DFL integral's too (tiny)
    criterion = (DetectionLoss.for_model(model) if hasattr(DetectionLoss, "for_model")  # a checkout before YOLO26's
                 else DetectionLoss(num_classes=classes, strides=model.strides, reg_max=model.reg_max))
    if hasattr(criterion, "dense"):  # a checkout from before the loss's fixed foreground slots: CUDA's (dense) form
        criterion.dense = True
    padded = targets_to_padded(synthetic_targets(batch, boxes, classes), batch, (size, size), slots=box_slots(boxes))

    def total(tracker: MemTracker, kind: str) -> float:
        return sum(stats["Total"] for stats in tracker.get_tracker_snapshot(kind).values()) / 2**20  # every device

    with FakeTensorMode(allow_non_fake_inputs=True):
        images = torch.empty(batch, 3, size, size, dtype=dtype).contiguous(memory_format=torch.channels_last)
        tracker = MemTracker()
        tracker.track_external(model, images)
        with tracker:
            outputs = model(images)
            forward = total(tracker, "current")
            loss, _ = criterion(outputs, padded, (size, size))
            loss.backward()
        return {"forward_mb": forward, "peak_mb": total(tracker, "peak")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="n", choices=MODEL_NAMES)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--sizes", default="640,704", help="comma-separated input sizes (default: 640 and the "
                                                           "default multi-scale's largest at 640, 704)")
    parser.add_argument("--boxes", type=int, default=20, help="boxes an image (default 20: 32 box slots)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp16")
    parser.add_argument("--recompute", choices=("on", "off"), default="on",
                        help="BatchNorm's outputs at strides 2 and 4 recomputed in backward (on: CUDA training's "
                             "default)")
    args = parser.parse_args()
    try:
        import torch._subclasses.fake_tensor  # noqa: F401
        import torch.distributed._tools.mem_tracker  # noqa: F401
    except ImportError as error:
        print(f"error: this PyTorch ({torch.__version__}) lacks the fake-tensor memory tracker: {error}",
              file=sys.stderr)
        return 1
    print(f"{display_name(args.model)}, {args.classes} classes, batch {args.batch}, {args.boxes} boxes an image "
          f"({box_slots(args.boxes)} slots), model in {args.dtype}, loss in FP32, --recompute {args.recompute}; "
          f"tensors only")
    print("| size px | after forward MB | step peak MB | loss and backward above forward MB |\n|---:|---:|---:|---:|")
    for size in (int(text) for text in args.sizes.split(",")):
        result = step_memory(scale=args.model, classes=args.classes, batch=args.batch, size=size, boxes=args.boxes,
                             dtype=DTYPES[args.dtype], recompute=args.recompute == "on")
        print(f"| {size} | {result['forward_mb']:,.0f} | {result['peak_mb']:,.0f} | "
              f"{result['peak_mb'] - result['forward_mb']:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
