"""The CUDA graphs' key book: which key a step takes (its box slots) and when a key is captured. Pure bookkeeping,
so it runs here; tests/training/test_cuda_graph.py runs it with real captures on a GPU (a new count, and a smaller
count padded to a larger key)."""

import random

from detector.loss import box_slots
from detector.training.graph_keys import (KEY_COST_PADDING, MAX_GRAPHS, RUNS_FOR_A_KNOWN_SHAPE, WARMUP_RUNS, KeyBook,
                                         eager_runs, padding_cost)

SHAPE, OTHER = (64, 3, 640, 640), (64, 3, 672, 672)


def step(book: KeyBook, shape: tuple[int, ...], most_boxes: int, with_optimizer: bool = True) -> tuple:
    """One step as StepGraphs takes it: the key, then what the book says to do, recorded."""
    key = book.key(shape, most_boxes, with_optimizer)
    action = book.action(key)
    if action == "eager":
        book.ran_eagerly(key)
    elif action == "capture":
        book.captured(key)
    return key, action


def test_a_key_of_a_known_input_shape_runs_eagerly_once_before_its_capture():
    assert [eager_runs(0, 0), eager_runs(1, 1)] == [WARMUP_RUNS] * 2  # the first key of a shape: the full warm-up
    # Once other keys of its shape ran WARMUP_RUNS times (cuDNN met its convolutions): one run.
    assert [eager_runs(0, WARMUP_RUNS), eager_runs(0, WARMUP_RUNS + 3)] == [RUNS_FOR_A_KNOWN_SHAPE] * 2
    assert eager_runs(1, WARMUP_RUNS) == WARMUP_RUNS  # only its own runs: not yet known from others
    assert RUNS_FOR_A_KNOWN_SHAPE >= 1  # never captured cold


def test_each_key_warms_up_is_captured_and_then_replays():
    book = KeyBook()
    actions = [step(book, SHAPE, 3)[1] for _ in range(WARMUP_RUNS + 2)]
    assert actions == ["eager"] * WARMUP_RUNS + ["capture", "replay"]
    # A larger count at the same shape: its own key, eager once (cuDNN knows the shape), then captured.
    actions = [step(book, SHAPE, 40) for _ in range(RUNS_FOR_A_KNOWN_SHAPE + 1)]
    assert [key[1] for key, _ in actions] == [64] * (RUNS_FOR_A_KNOWN_SHAPE + 1)
    assert [action for _, action in actions] == ["eager"] * RUNS_FOR_A_KNOWN_SHAPE + ["capture"]


def test_without_a_padding_budget_every_batch_takes_its_own_power_of_two():
    book = KeyBook(key_cost_padding=0)
    for most_boxes in (40, 3, 20, 3):
        assert book.key(SHAPE, most_boxes, True) == (SHAPE, box_slots(most_boxes), True)
        book.ran_eagerly((SHAPE, box_slots(most_boxes), True))


def test_a_smaller_count_rides_a_larger_key_until_its_padding_would_have_bought_its_own():
    assert padding_cost(SHAPE, 32) == 64 * 640 * 640 * 32 == 16 * padding_cost((16, 3, 320, 320), 32)
    padded = padding_cost(SHAPE, 64 - 16)
    book = KeyBook(key_cost_padding=2 * padded + 1)
    assert step(book, SHAPE, 40)[0] == (SHAPE, 64, True)
    # 3 boxes need 16 slots; padded to the shape's 64 (48 slots at 64 x 640 x 640 each): twice, then its own key.
    keys = [step(book, SHAPE, 3)[0][1] for _ in range(4)]
    assert keys == [64, 64, 16, 16]
    assert book.padding[(SHAPE, 16, True)] == 2 * padded  # a third would have gone over the budget
    # Another shape's first key takes the run's most slots, so its smaller batches fit under it too.
    assert step(book, OTHER, 3)[0] == (OTHER, 64, True)
    # Keys with and without the optimizer are different graphs: never padded to each other.
    assert step(book, SHAPE, 20, with_optimizer=False)[0] == (SHAPE, 64, False)  # the run's most, again
    assert step(book, SHAPE, 20)[0] == (SHAPE, 64, True)  # padded: 32 rides 64 with the optimizer


def test_a_count_above_every_key_opens_its_own_and_raises_the_most():
    book = KeyBook()
    assert step(book, SHAPE, 3)[0][1] == 16
    assert step(book, SHAPE, 100)[0][1] == 128
    assert book.most_slots == 128
    assert step(book, SHAPE, 20)[0][1] == 128  # the smallest key that fits, not the run's first


def test_the_padding_spent_on_a_count_stays_within_one_key_of_the_budget():
    """Ski rental's bound: the padding spent on a count before it gets its own key (or in a run that never opens it)
    is at most the budget, and every box has a slot."""
    rng = random.Random(0)
    for budget in (0, padding_cost(SHAPE, 64), KEY_COST_PADDING):
        book = KeyBook(key_cost_padding=budget)
        for _ in range(2000):
            shape = rng.choice([SHAPE, OTHER])
            most_boxes = min(int(rng.expovariate(1 / 12)), 300)
            with_optimizer = rng.random() < 0.8
            key = step(book, shape, most_boxes, with_optimizer)[0]
            assert key[1] >= box_slots(most_boxes)  # every box has a slot
        assert all(spent <= budget for spent in book.padding.values())
        if budget == 0:
            assert not book.padding


def test_retired_warm_up_keys_take_no_more_steps():
    book = KeyBook()
    for _ in range(WARMUP_RUNS + 1):
        step(book, SHAPE, 3, with_optimizer=False)  # captured
    step(book, SHAPE, 40, with_optimizer=False)  # eager once, not captured
    assert book.retire_partial_steps() == [(SHAPE, 16, False), (SHAPE, 64, False)]
    assert not book.graphs  # the captured one's graph can go
    assert not any(not key[2] for key in book.known())
    assert book.runs[(SHAPE, 16, False)] == WARMUP_RUNS  # still counted: cuDNN has met the shape
    # The whole step's first key at that shape: eager once (the shape is known), not padded to a retired key.
    key, action = step(book, SHAPE, 3)
    assert key == (SHAPE, 64, True) and action == "eager"  # the run's most slots so far: 64


def test_past_the_graph_limit_new_keys_run_eagerly():
    book = KeyBook(max_graphs=1)
    for _ in range(WARMUP_RUNS + 1):
        step(book, SHAPE, 3)
    assert [step(book, OTHER, 3)[1] for _ in range(WARMUP_RUNS + 3)] == ["eager"] * (WARMUP_RUNS + 3)
    assert MAX_GRAPHS >= 5 * 3 * 2  # the default list's five sizes, a few counts each, with and without optimizer
