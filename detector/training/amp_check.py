"""AMP preflight: one step in FP32 and one under the chosen precision, from the same weights and batch.

If the reduced-precision step gives a non-finite loss or gradients, or strays from FP32 by more than the
tolerances below, training falls back (FP16 -> BF16 where supported -> FP32) before the first epoch.
Works offline on the user's own model and data; a few seconds for a nano model.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from detector.assigner import AssignedTargets
from detector.distributed import unwrap, without_sync_batchnorm
from detector.files import write_text_atomically
from detector.inference.preprocess import model_input
from detector.loss import DetectionLoss
from detector.precision import Precision, fallback_chain
from detector.training.engine import TrainStep
from detector.tuning import cudnn_heuristics

# BF16 keeps 8 mantissa bits, FP16 11. The assigner's top-k choices are discrete, so a rounding change
# re-assigns a few anchors and swings the gradient (cosine to FP32 fell to 0.50 in BF16 when each
# precision assigned for itself); the check therefore holds the FP32 step's assignment fixed. Then,
# measured on first batches of the built-in dataset with a fresh nano model: loss within 0.1%, gradient
# norm ratio 0.87-1.08, gradient cosine 0.60-0.91 in BF16 (its 8-bit mantissa is noisy in backward)
# and 0.95-0.996 in FP16. A broken precision gives non-finite, vanished (norm ratio ~0) or unrelated gradients.
#
# Unrelated is told by the median over the parameter tensors of each tensor's cosine to FP32's, not by the cosine of
# the whole gradient. The whole gradient's is ruled by the few tensors that hold most of its energy (the stride-2
# convolutions: a fifth each), so one noisy batch swings it: on BCCD's first batches (2-core EPYC, AVX-512 BF16, 320
# px) healthy BF16 gave 0.09-0.84, and the 0.09 run, failed under a bound of 0.2, trained in BF16 (--no-amp-check) to
# the FP32 run's mAP (0.4994 against 0.4991). And an unrelated gradient with the real one's magnitudes (the FP32
# gradient with random signs) reached +-0.024 on that batch, its energy in few coordinates. Per tensor, the same
# batches' medians were 0.30-0.89 (YOLO11n 0.30, 0.77, 0.61, 0.48; YOLOv8n 0.80, 0.64, 0.89, 0.87, seeds 0-3), while
# the sign-flipped gradient's medians stayed within 0.011 (spread <= 0.003, 20 draws a batch). The bound sits 3x
# under the lowest healthy median and over 30 spreads above the unrelated ones.
LOSS_TOLERANCE = 0.05
MIN_GRADIENT_COSINE = 0.1  # of the median tensor
GRADIENT_NORM_RATIO = (0.5, 2.0)
FP16_TEST_SCALE = 2.0**10  # a fixed loss scale, so FP16 gradients are not lost to underflow in the test
# The check steps on the first images of the batch only. Its FP32 reference step holds FP32 activations, about
# twice a FP16 step's: on the whole batch it set the run's peak GPU memory (the issue measured 12.8 GB at batch 64
# with AMP, the same as --unamp, against 7.65 GB for the FP16 step alone). What it detects (overflow, non-finite or
# vanished gradients, an unrelated direction) shows on any image; 8 keep the loss an average over several.
CHECK_IMAGES = 8


@dataclass
class StepCheck:
    precision: str
    loss_fp32: float
    loss_amp: float
    loss_relative_error: float
    gradient_cosine: float  # of the whole gradient: for the record (its energy sits in few tensors)
    passed: bool
    reason: str
    median_tensor_cosine: float = float("nan")  # what is checked: each parameter tensor's cosine, their median


@dataclass
class PreflightResult:
    requested: str
    chosen: str
    checks: list[StepCheck]

    @property
    def fell_back(self) -> bool:
        return self.chosen != self.requested

    def line(self) -> str:
        last = self.checks[-1] if self.checks else None
        if not self.fell_back:
            detail = (f" (loss diff {last.loss_relative_error:.2%}, gradient cosine per tensor "
                      f"{last.median_tensor_cosine:.3f})" if last else "")
            return f"AMP check: {self.chosen} passed{detail}"
        failed = "; ".join(f"{c.precision}: {c.reason}" for c in self.checks if not c.passed)
        return f"AMP check: {failed} -> falling back to {self.chosen}"


def _step(model: nn.Module, criterion: DetectionLoss, images: torch.Tensor, targets: torch.Tensor,
          precision: Precision, assigned: AssignedTargets | None = None
          ) -> tuple[float, list[torch.Tensor], AssignedTargets]:
    """Loss, each parameter's flattened gradient (FP32) and assignment of one step on a private copy of the model."""
    work = copy.deepcopy(model).train()
    with precision.autocast():
        outputs = work(images)
    # One rank runs the check by itself: the loss must not wait on the other ranks (see DetectionLoss).
    loss, _ = criterion(outputs, targets, images.shape[2:], assigned=assigned, across_ranks=False,
                        keep_assignment=True)
    scale = FP16_TEST_SCALE if precision.uses_scaler else 1.0
    (loss * scale).backward()
    grads = [p.grad.float().flatten() / scale for p in work.parameters() if p.grad is not None]
    kept, criterion.last_assignment = criterion.last_assignment, None  # the run's loss: nothing kept into training
    assert kept is not None
    return float(loss.detach()), grads or [torch.zeros(1)], kept


def compare_step(model: nn.Module, criterion: DetectionLoss, images: torch.Tensor, targets: torch.Tensor,
                 precision: Precision, reference: tuple[float, torch.Tensor, AssignedTargets]) -> StepCheck:
    loss_ref, grads_ref, assigned = reference
    loss_amp, grads_amp, _ = _step(model, criterion, images, targets, precision, assigned)
    grad_ref, grad_amp = torch.cat(grads_ref), torch.cat(grads_amp)
    finite = torch.isfinite(torch.tensor(loss_amp)) and bool(torch.isfinite(grad_amp).all())
    loss_error = abs(loss_amp - loss_ref) / max(abs(loss_ref), 1e-12) if finite else float("inf")
    cosine = float(torch.nn.functional.cosine_similarity(grad_amp, grad_ref, dim=0)) if finite else float("nan")
    median = median_tensor_cosine(grads_amp, grads_ref) if finite else float("nan")
    norm_ratio = float(grad_amp.norm() / grad_ref.norm().clamp(min=1e-12)) if finite else float("nan")
    if not finite:
        reason = "non-finite loss or gradients"
    elif loss_error > LOSS_TOLERANCE:
        reason = f"loss differs from FP32 by {loss_error:.1%} (> {LOSS_TOLERANCE:.0%})"
    elif not GRADIENT_NORM_RATIO[0] <= norm_ratio <= GRADIENT_NORM_RATIO[1]:
        reason = f"gradient norm is {norm_ratio:.2f}x FP32's (outside {GRADIENT_NORM_RATIO})"
    elif not median >= MIN_GRADIENT_COSINE:
        reason = f"gradient direction differs from FP32 (cosine per tensor {median:.2f} < {MIN_GRADIENT_COSINE})"
    else:
        reason = "ok"
    return StepCheck(precision.name, loss_ref, loss_amp, loss_error, cosine, reason == "ok", reason, median)


def median_tensor_cosine(grads: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """The median over parameter tensors of each one's gradient cosine to ``reference``'s; tensors whose reference
    gradient is zero (a level no target reached) say nothing of a direction and are left out."""
    cosines = [torch.nn.functional.cosine_similarity(grad, ref, dim=0) for grad, ref in zip(grads, reference)
               if bool(ref.any())]
    return float(torch.stack(cosines).median()) if cosines else 1.0


def first_images(images: torch.Tensor, targets: torch.Tensor, count: int = CHECK_IMAGES) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` images of a batch ``[B, ...]`` and their rows of ``targets`` ``[N, 6]`` (column 0: the
    image's index in the batch, unchanged for the images kept)."""
    return images[:count], targets[targets[:, 0] < count]


def amp_preflight(step: TrainStep, images: torch.Tensor, targets: torch.Tensor) -> tuple[Precision, PreflightResult]:
    """Check the step's precision on its model and this batch; return the precision to train with and the evidence.

    ``images`` are float ``[B, 3, H, W]`` in [0, 1] on the model's device; ``targets`` ``[N, 6]``. The step itself
    is not changed: each check trains a private copy of its bare model (not the DDP wrapper).
    """
    precision = step.precision
    if precision.name == "fp32":
        return precision, PreflightResult("fp32", "fp32", [])
    # The check's shapes (CHECK_IMAGES images, FP32 and the candidates' dtypes) are never trained on: cuDNN
    # autotuning, where the run has it on, would time each convolution's algorithms for them, forward and backward,
    # for nothing (the issue measured ~10 s per new training shape on an H100). The algorithm changes rounding only.
    with cudnn_heuristics(images.device):
        return _check_chain(step, images, targets)


def _check_chain(step: TrainStep, images: torch.Tensor, targets: torch.Tensor) -> tuple[Precision, PreflightResult]:
    """The FP32 reference step, then each precision of the fallback chain until one passes."""
    criterion, precision = step.criterion, step.precision
    model = without_sync_batchnorm(unwrap(step.model))  # one rank runs this: no layer may wait on the others
    reference = _step(model, criterion, images, targets, Precision("fp32", precision.device_type, "reference"))
    checks = []
    for candidate in fallback_chain(precision):
        if candidate.name == "fp32":
            return candidate, PreflightResult(precision.name, "fp32", checks)
        check = compare_step(model, criterion, images, targets, candidate, reference)
        checks.append(check)
        if check.passed:
            return candidate, PreflightResult(precision.name, candidate.name, checks)
    raise AssertionError("unreachable: the chain always ends in FP32")


def check_first_batch(step: TrainStep, batch: tuple, *, channels_last: bool, save_to: Path,
                      log: Callable[[str], None]) -> tuple[str, str]:
    """The run's AMP check on its first loader batch (``collate`` output, on the host): ``(precision name, reason)``
    to train with. Writes the evidence to ``save_to`` and logs its line; FP32 runs check nothing."""
    precision = step.precision
    if precision.name == "fp32":
        return precision.name, precision.reason
    images, targets = first_images(batch[0], batch[1])  # its FP32 step's memory is not the run's peak
    images = model_input(images, step.device, channels_last=channels_last)
    chosen, result = amp_preflight(step, images, targets.to(step.device))
    save_preflight(result, save_to)
    log(result.line())
    return chosen.name, ("chosen by the AMP check" if result.fell_back else precision.reason)


def save_preflight(result: PreflightResult, path: Path) -> None:
    """The evidence as strict JSON: a failed check's non-finite loss or cosine is ``null`` (``NaN``/``Infinity``, what
    json writes by default, are not JSON and strict parsers refuse the file). ``requested``: the precision checked
    first (under ``--precision auto``, the one auto chose)."""
    checks = [{key: value if not isinstance(value, float) or math.isfinite(value) else None
               for key, value in asdict(check).items()} for check in result.checks]
    write_text_atomically(path, json.dumps({"requested": result.requested, "chosen": result.chosen, "checks": checks},
                                           indent=2, allow_nan=False))
