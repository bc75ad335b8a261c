"""The next iteration's hyperparameters in ``detector tune``: a mutation of one of the fittest so far.

Iteration 1 trains the run's own values (train's defaults, or the flags given), so the tune starts from the
baseline a plain ``detector train`` gives. Each later one picks a parent among the :data:`PARENTS` fittest iterations,
fitness-weighted, and moves each setting with probability :data:`MUTATION_PROBABILITY` by a Gaussian step of
``SIGMA * gain`` in the space normalised to [0, 1] (at least one setting moves), clipped to the bounds and rounded
(5 decimals; integers stay integers). A set tried before is drawn again, up to :data:`ATTEMPTS` times.

The generator is seeded from (seed, iteration): a resumed or repeated tune draws the same settings from the same
results, and the draw depends on nothing else (not on how many draws an earlier iteration took).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from detector.workflows.tune_space import Bounds, is_integer

PARENTS = 5  # YOLOv5's evolve took its parent among the 5 fittest; few enough that the search stays near the best
MUTATION_PROBABILITY = 0.5
SIGMA = 0.2  # of the normalised range: a step of 0.2 moves lr0 by ~2e-3 of its [1e-5, 1e-2]
DECIMALS = 5
ATTEMPTS = 200


def constrained(space: dict[str, Bounds], values: dict[str, float]) -> dict[str, float]:
    """``values`` rounded (5 decimals, or whole numbers) and clipped to the space's bounds."""
    out: dict[str, Any] = {}
    for name, bounds in space.items():
        if is_integer(name):
            out[name] = int(min(max(round(values[name]), bounds.low), bounds.high))
        else:
            out[name] = float(min(max(round(float(values[name]), DECIMALS), bounds.low), bounds.high))
    return out


def key(space: dict[str, Bounds], values: dict[str, Any]) -> tuple[float, ...]:
    """What makes two sets the same set: their values in the space's order."""
    return tuple(float(values[name]) for name in space)


def parent_index(fitness: np.ndarray, rng: np.random.Generator) -> int:
    """One of the :data:`PARENTS` fittest rows, each as likely as its fitness above the worst of them (plus a
    little, so that equal fitnesses, all zero included, are equally likely)."""
    order = np.argsort(-fitness, kind="stable")[:PARENTS]
    weights = fitness[order] - fitness[order].min() + 1e-6
    return int(order[rng.choice(len(order), p=weights / weights.sum())])


def mutate(space: dict[str, Bounds], history: Sequence[tuple[float, dict[str, Any]]], baseline: dict[str, Any],
           *, seed: int, iteration: int) -> dict[str, Any]:
    """The settings iteration ``iteration`` (1-based) trains: ``baseline`` for the first, else a mutation.

    ``history``: (fitness, settings) of the iterations before, in order; settings missing a name of the space
    (an older record) read as ``baseline``'s. Raises ``ValueError`` when no new set can be drawn (a space too
    small for the iterations asked).
    """
    if not history:
        # As given, not clipped: iteration 1 is what ``detector train`` with these flags trains.
        return dict(baseline)
    names = list(space)
    low = np.array([space[name].low for name in names], dtype=float)
    span = np.array([space[name].high - space[name].low for name in names], dtype=float)
    movable = span > 0
    if not movable.any():
        raise ValueError("tune: every range of the space is a single value: nothing to evolve")
    rng = np.random.default_rng([seed, iteration])
    fitness = np.nan_to_num(np.array([row[0] for row in history], dtype=float))
    seen = {key(space, {**baseline, **row[1]}) for row in history}
    unit = np.divide(1.0, span, out=np.zeros_like(span), where=movable)
    # A whole-number setting needs a step of at least 1 to move at all.
    steps = np.array([SIGMA * space[name].gain for name in names])
    steps = np.maximum(steps, np.array([unit[i] if is_integer(name) else 0.0 for i, name in enumerate(names)]))
    for attempt in range(ATTEMPTS):
        parent = {**baseline, **history[parent_index(fitness, rng)][1]}
        genes = np.clip((np.array([float(parent[name]) for name in names]) - low) * unit, 0.0, 1.0)
        if attempt < ATTEMPTS // 2:
            moved = (rng.random(len(names)) < MUTATION_PROBABILITY) & movable
            if not moved.any():
                moved[rng.choice(np.flatnonzero(movable))] = True
            genes = np.clip(genes + moved * rng.standard_normal(len(names)) * steps, 0.0, 1.0)
        else:  # the neighbourhood is used up: anywhere in the space
            genes = np.where(movable, rng.random(len(names)), genes)
        values = constrained(space, {name: low[i] + genes[i] * span[i] for i, name in enumerate(names)})
        if key(space, values) not in seen:
            return {**baseline, **values}
    raise ValueError(f"tune: no new set of settings after {ATTEMPTS} draws: the space is too small for the "
                     f"iterations asked (widen its ranges or ask fewer)")
