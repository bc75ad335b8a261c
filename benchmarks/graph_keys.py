"""The CUDA-graph keys a GPU run would meet, epoch by epoch, replayed on any machine: no GPU, no pixels.

A graphed step's key is its input shape, its box slots and whether it ends with the optimizer
(detector/training/graph_keys.py). Each new key costs the loop eager steps and a capture, and short runs meet most
of theirs in their first epochs: the H100 ran the mosaic regime's 2 epochs at 0.44 of its step alone, and its first
epoch at 2.35x a steady one (docs/gpu.md). Which keys a run meets is known without a GPU: the sizes come from the
seed (detector/training/multiscale.py) and the box slots from each batch's fullest image after mosaic and the
affine warp, which the training split computes from its labels. So this builds the run's training split as
``train.py`` would on CUDA (the device augmentation path; each image stands in as an empty array of its size, so no
file is decoded: the boxes are the same, only pixels are missing), draws every epoch's batches, and passes their
keys through the run's :class:`KeyBook`, once per padding budget (``--budgets``, in units of the book's own; 0 is
each batch's own power of two, as before the budget).

    python benchmarks/graph_keys.py --data /tmp/shapes4096/shapes.yaml --imgsz 640 --batch 64 --epochs 2 \\
        --close-mosaic 0                                                     # the gpu_lease.sh mosaic stage's run
    python benchmarks/graph_keys.py --data ../shared/data/bccd/bccd.yaml --imgsz 640 --batch 16 --epochs 100

Every other flag is train.py's. The table counts per epoch: keys new to the run, captures, eager steps (a key's
warm-up, or past the graph limit), and the padded slot-pixels (images x height x width x slots beyond each batch's
own power of two, summed over steps). What they cost on a GPU is the run's own measurement (``results.csv``'s
``graph_*`` columns); the last column weighs them with ``--eager-cost`` and ``--capture-cost`` (extra step-times
each: the H100 ran eager steps at ~0.5x the graphed rate, so 1; a capture's host time is about an eager step's, so
2) and the padding at the book's own estimate (one key, an eager run and a capture at batch 64 and 640 px, per
:data:`KEY_COST_PADDING` slot-pixels): a model, not a measurement, and in step-times of batch 64 at 640 px, so it
overstates the padding of smaller steps, which a GPU runs at less than their share of the work.
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import math
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from detector.cli.train import build_parser
from detector.cli.flags import options_from_args
from detector.data.build import SplitData
from detector.data.sampler import EpochSampler
from detector.loss import box_slots
from detector.training.builders import build_data, warmup_steps
from detector.training.config import TrainConfig
from detector.training.graph_keys import KEY_COST_PADDING, KeyBook, padding_cost
from detector.training.multiscale import MultiScale
from detector.training.schedule import StepSchedule, step_role



class DrawOnly:
    """Albumentations' draws without their pixel work (the images are empty arrays here)."""

    def __init__(self, transforms: Any) -> None:
        self.transforms = transforms

    def draw(self, rng: np.random.Generator) -> Any:
        return self.transforms.draw(rng)

    def apply(self, image: np.ndarray, drawn: Any) -> np.ndarray:
        return image


def label_only(split: SplitData, image_size: int) -> None:
    """Make ``split``'s dataset hand out each image as an empty array of its resized shape: the boxes come out as with
    the pixels (every draw and box transform is the same), and no file is read or decoded."""
    dataset = split.dataset
    dataset.image_cache = None
    if dataset.albumentations is not None:  # pixel-only: drawn as ever (the flips' draws come after), never applied
        dataset.albumentations = DrawOnly(dataset.albumentations)
    dataset.geometry_on_device = dataset.pixel_ops_on_device = True  # the CUDA path: regions as views, no warp
    image_hw = split.records.image_hw

    def load(index: int) -> tuple[np.ndarray, tuple[int, int]]:
        height, width = (int(side) for side in image_hw[index])
        ratio = image_size / max(height, width)
        return np.empty((round(height * ratio), round(width * ratio), 3), np.uint8), (height, width)

    dataset.load = load


def batch_boxes(split: SplitData, sampler: EpochSampler, batch: int) -> Iterator[tuple[int, int]]:
    """Per batch of the sampler's pass (the loader's: the last one may be short), its images and the most boxes one
    image holds."""
    keys = list(sampler)
    for start in range(0, len(keys), batch):
        part = keys[start:start + batch]
        yield len(part), max((len(split.dataset[key][1]) for key in part), default=0)


def simulate(config: TrainConfig, split: SplitData, budgets: list[int]) -> dict[int, list[Counter]]:
    """Per budget, per epoch: new keys, captures, eager steps, replays, padded slot-pixels, steps."""
    sampler = EpochSampler(len(split.dataset), seed=config.seed, batch=config.batch)
    steps = math.ceil(len(sampler) / config.batch)  # len(loader): a share under one batch is one short batch
    schedule = StepSchedule(
        epochs=config.epochs, steps_per_epoch=steps,
        warmup_steps=warmup_steps(config.warmup_epochs, steps, config.epochs), base_lr=0.01, final_lr_fraction=0.01,
        cosine=False, warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=0.9, batch_size=config.batch,
        nominal_batch=config.nominal_batch, clip_grad=10.0)
    multi_scale = MultiScale(config.imgsz, low=config.multi_scale_min, high=config.multi_scale_max,
                             hold=config.multi_scale_hold, epochs=config.epochs, fixed_last_epochs=config.close_mosaic,
                             enabled=config.multi_scale)
    books = {budget: KeyBook(key_cost_padding=budget) for budget in budgets}
    tallies: dict[int, list[Counter]] = {budget: [] for budget in budgets}
    last_step = -1
    for epoch in range(config.epochs):
        sampler.set_epoch(epoch, use_mosaic=epoch < config.epochs - config.close_mosaic)
        sizes = multi_scale.sizes(steps, seed=config.seed, epoch=epoch)
        for tally in tallies.values():
            tally.append(Counter())
        for index, (images, most_boxes) in enumerate(batch_boxes(split, sampler, config.batch)):
            step = epoch * steps + index
            role = step_role(schedule, step, accumulate=schedule.values(step).accumulate, last_optimizer_step=last_step,
                             last_in_epoch=index == steps - 1)  # the loop's own rules (detector/training/engine.py)
            shape = (images, 3, sizes[index], sizes[index])
            for budget, book in books.items():
                if role.warmup_ended:
                    book.retire_partial_steps()
                tally = tallies[budget][-1]
                known = book.known()
                key = book.key(shape, most_boxes, role.graphed_optimizer)
                tally["new keys"] += key not in known
                action = book.action(key)
                if action == "eager":
                    book.ran_eagerly(key)
                elif action == "capture":
                    book.captured(key)
                tally[action] += 1
                tally["padded"] += padding_cost(shape, key[1] - box_slots(most_boxes))
                tally["steps"] += 1
            if role.stepping:
                last_step = step
    return tallies


def extra_steps(tally: Counter, eager_cost: float, capture_cost: float) -> float:
    """Step-times the keys cost beyond graphed steps, by the model in the module docstring: the padding at the book's
    own price, :data:`KEY_COST_PADDING` slot-pixels for a key (an eager run and a capture)."""
    return (tally["eager"] * eager_cost + tally["capture"] * capture_cost
            + tally["padded"] * (eager_cost + capture_cost) / KEY_COST_PADDING)


def row(first: str, tally: Counter, args: argparse.Namespace) -> str:
    """A table row: ``first`` (budget and epoch), then ``tally``'s counts and the modelled extra step-times."""
    extra = extra_steps(tally, args.eager_cost, args.capture_cost)
    return (f"| {first} | {tally['steps']} | {tally['new keys']} | {tally['capture']} | {tally['eager']} | "
            f"{tally['padded']:.3g} | {extra:.1f} |")


def main() -> int:
    parser = build_parser()
    parser.prog = "graph_keys.py"
    parser.add_argument("--budgets", default="0,1",
                        help="comma list of padding budgets in units of graph_keys.KEY_COST_PADDING (slot-pixels; 1: "
                             "the book's; 0: each batch's own power of two)")
    parser.add_argument("--eager-cost", type=float, default=1.0, help="extra step-times of an eager step")
    parser.add_argument("--capture-cost", type=float, default=2.0, help="extra step-times of a capture")
    args = parser.parse_args()
    budgets = [round(float(budget) * KEY_COST_PADDING) for budget in args.budgets.split(",")]
    extra = {"budgets", "eager_cost", "capture_cost"}
    config = options_from_args(TrainConfig, argparse.Namespace(
        **{key: value for key, value in vars(args).items() if key not in extra})).with_defaults()
    if config.batch < 1:
        parser.error("--batch: give the run's batch (the script cannot size --batch -1 from a GPU's memory)")
    config.cache = "none"
    _, split, _ = build_data(config, with_val=False, device=torch.device("cuda"))
    label_only(split, config.imgsz)
    tallies = simulate(config, split, budgets)
    print(f"{config.data}: {len(split.dataset)} images, batch {config.batch}, {config.epochs} epochs at {config.imgsz} "
          f"(close-mosaic {config.close_mosaic}, multi-scale {'on' if config.multi_scale else 'off'}); extra "
          f"step-times: eager {args.eager_cost}, capture {args.capture_cost}, padding "
          f"{args.eager_cost + args.capture_cost:g} per "
          f"{KEY_COST_PADDING:.3g} slot-pixels (budget 1)\n")
    print("| budget | epoch | steps | new keys | captures | eager steps | padded slot-pixels | extra step-times |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    shown = set(range(min(config.epochs, 5))) | {config.epochs - 1}
    for budget in budgets:
        total = Counter()
        for epoch, tally in enumerate(tallies[budget]):
            total.update(tally)
            if epoch in shown:
                print(row(f"{budget / KEY_COST_PADDING:g} | {epoch + 1}", tally, args))
        late = sum(1 for tally in tallies[budget][5:] if tally["new keys"])
        print(row(f"{budget / KEY_COST_PADDING:g} | all", total, args))
        if config.epochs > 5:
            print(f"|  | epochs after the 5th with a new key: {late} |  |  |  |  |  |  |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
