"""``resolved.yaml``: what a run's ``auto`` settings became on this host.

``config.yaml`` keeps what was asked (``--precision auto``, ``--optimizer auto``, ``--pixel-augment auto``, ``--cache
auto``, ``--workers -1``, ``--batch -1``, ``--device ''``) so that ``cfg=config.yaml`` asks the same again; on another
host those resolve differently (BF16 or FP32 on a CPU, AdamW or SGD by run length). This file records the choices
once they are known, after the AMP check, beside the versions that made them, so a run can be compared or repeated
with every choice named (its keys are our flags' names), and what ``--rect`` turned off (mosaic, multi-scale).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml

from detector.checkpoint import software_versions
from detector.distributed import unwrap
from detector.files import write_text_atomically
from detector.training.header import Run, cache_used, pixel_augment_path
from detector.training.rect import mixing

RESOLVED_FILE = "resolved.yaml"


def resolved_settings(run: Run) -> dict[str, Any]:
    """The run's settings as this host resolved them, under our flags' names (plus the versions)."""
    step, config = run.step, run.config
    return {
        "precision": step.precision.name,
        "precision_reason": step.precision.reason,
        "optimizer": run.optimizer_name,
        "lr0": step.schedule.base_lr,
        "momentum": config.momentum,  # SGD/RMSprop momentum, the Adam family's beta1
        "pixel_augment": pixel_augment_path(run),
        "rect": config.rect,  # and what it turned off (detector/training/rect.py), as the run had them
        "multi_scale": config.multi_scale,
        "mosaic": mixing(config)["mosaic"],
        "cache": cache_used(run),
        "workers": config.workers,
        "device": str(run.device),
        "world_size": run.dist.world_size,
        "batch": config.batch,  # per process
        "model": unwrap(step.model).scale,
        **software_versions(),  # detector's and torch's, as each checkpoint names them
        "cuda": torch.version.cuda and str(torch.version.cuda),  # None: a CPU build
    }


def write_resolved(run: Run) -> Path:
    """Write ``<run>/resolved.yaml`` (rank 0 alone calls it; a resumed run rewrites it with this host's choices)."""
    path = run.run_dir / RESOLVED_FILE
    write_text_atomically(path, yaml.safe_dump(resolved_settings(run), sort_keys=False))
    return path
