"""detector tune's mutation (detector/workflows/tune_mutation.py): bounds, integers, determinism, parents, repeats."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from detector.workflows.tune_mutation import PARENTS, mutate, parent_index
from detector.workflows.tune_space import DEFAULT_SPACE, Bounds

BASELINE = {"lr0": 0.01, "momentum": 0.937, "box_gain": 7.5, "close_mosaic": 10}
SPACE = {name: DEFAULT_SPACE[name] for name in BASELINE}


def random_history(rng: np.random.Generator, count: int) -> list[tuple[float, dict]]:
    history = []
    for _ in range(count):
        values = {name: float(rng.uniform(bounds.low, bounds.high)) for name, bounds in SPACE.items()}
        values["close_mosaic"] = int(rng.integers(0, 11))
        history.append((float(rng.random()), values))
    return history


def test_the_first_iteration_trains_the_given_values_as_given():
    given = {**BASELINE, "lr0": 0.5}  # outside the space's [1e-5, 1e-2]: iteration 1 is what train would train
    assert mutate(SPACE, [], given, seed=0, iteration=1) == given


def test_mutations_keep_the_bounds_and_integers_stay_integers():
    rng = np.random.default_rng(1)
    moved = Counter()
    for iteration in range(2, 120):
        values = mutate(SPACE, random_history(rng, 4), BASELINE, seed=3, iteration=iteration)
        assert set(values) == set(SPACE)
        for name, bounds in SPACE.items():
            assert bounds.low <= values[name] <= bounds.high, (name, values[name])
            moved[name] += values[name] != BASELINE[name]
        assert type(values["close_mosaic"]) is int and all(type(values[n]) is float for n in ("lr0", "momentum"))
        assert all(round(values[name], 5) == values[name] for name in ("lr0", "momentum", "box_gain"))
    assert all(count > 30 for count in moved.values()), moved  # every setting does move


def test_the_draw_depends_on_the_seed_the_iteration_and_the_history_alone():
    history = random_history(np.random.default_rng(2), 6)
    first = mutate(SPACE, history, BASELINE, seed=7, iteration=7)
    assert mutate(SPACE, list(history), dict(BASELINE), seed=7, iteration=7) == first
    assert mutate(SPACE, history, BASELINE, seed=8, iteration=7) != first
    assert mutate(SPACE, history, BASELINE, seed=7, iteration=8) != first
    changed = [(fitness + (0.5 if index == 0 else 0), values) for index, (fitness, values) in enumerate(history)]
    draws = {tuple(mutate(SPACE, changed, BASELINE, seed=7, iteration=i).values()) for i in range(7, 12)}
    assert len(draws) == 5


def test_fitter_parents_are_chosen_more_often_and_only_the_fittest_few():
    fitness = np.array([0.05, 0.3, 0.1, 0.9, 0.6, 0.0, 0.2, 0.02])
    rng = np.random.default_rng(0)
    counts = Counter(parent_index(fitness, rng) for _ in range(6000))
    top = list(np.argsort(-fitness)[:PARENTS])
    assert set(counts) <= set(top) and counts[3] > counts[4] > counts[1] > counts[6]
    equal = Counter(parent_index(np.zeros(3), rng) for _ in range(3000))  # all failed: each as likely
    assert set(equal) == {0, 1, 2} and min(equal.values()) > 800


def test_no_set_is_tried_twice_and_an_exhausted_space_says_so():
    space = {"close_mosaic": Bounds(0, 3), "flipud": Bounds(0.0, 0.0)}
    baseline = {"close_mosaic": 0, "flipud": 0.0}
    history = [(0.1, {"close_mosaic": 0, "flipud": 0.0}), (0.2, {"close_mosaic": 1, "flipud": 0.0}),
               (0.3, {"close_mosaic": 3, "flipud": 0.0})]
    for seed in range(5):
        assert mutate(space, history, baseline, seed=seed, iteration=4) == {"close_mosaic": 2, "flipud": 0.0}
    history.append((0.4, {"close_mosaic": 2, "flipud": 0.0}))
    with pytest.raises(ValueError, match=r"^tune: no new set of settings after \d+ draws"):
        mutate(space, history, baseline, seed=0, iteration=5)
