"""tune_fitness.png: each ``detector tune`` iteration's fitness, and the best so far."""

from __future__ import annotations

import itertools
from pathlib import Path

from detector.plots.canvas import new_figure, save_figure


def plot_tune_fitness(iterations: list[int], fitness: list[float], out_png: str | Path) -> Path:
    """Fitness (mAP50-95) per iteration as points, the best so far as a step line."""
    figure = new_figure(8, 4.5)
    axis = figure.add_subplot(1, 1, 1)
    best = list(itertools.accumulate(fitness, max))
    axis.plot(iterations, fitness, "o", color="tab:blue", alpha=0.6, label="iteration")
    axis.step(iterations, best, where="post", color="tab:orange", label="best so far")
    axis.set_xlabel("iteration")
    axis.set_ylabel("fitness (mAP50-95)")
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")
    return save_figure(figure, out_png)
