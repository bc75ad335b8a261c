from pathlib import Path
from types import SimpleNamespace

import pytest

from detector.training.config import TrainConfig
from detector.training.header import epochs_text, lr_text, warmup_text


@pytest.mark.parametrize(("optimizer", "chosen", "lr0", "said"), [
    ("auto", "AdamW", 0.05, True),  # the user's rate is not the run's: said
    ("auto", "AdamW", TrainConfig().lr0, False),  # no --lr0 given: nothing to say
    ("auto", "SGD", 0.05, False),  # a long run: auto chose SGD, which takes --lr0
    ("AdamW", "AdamW", 0.05, False),  # named: --lr0 is the rate
])
def test_an_lr0_that_auto_ignores_is_said_in_the_header(optimizer: str, chosen: str, lr0: float, said: bool):
    run = SimpleNamespace(config=TrainConfig(optimizer=optimizer, lr0=lr0), optimizer_name=chosen)
    text = lr_text(run)
    assert bool(text) == said
    if said:
        assert text == " (--optimizer auto chose AdamW and its own lr, not --lr0 0.05: name an optimizer to use it)"


def test_one_epoch_is_one_epoch():
    clock = SimpleNamespace(budget=None)
    assert epochs_text(SimpleNamespace(clock=clock, epochs=1, start_epoch=0)) == "1 epoch"
    assert epochs_text(SimpleNamespace(clock=clock, epochs=3, start_epoch=0)) == "3 epochs"


def test_a_resumed_run_says_where_it_goes_on_from():
    run = SimpleNamespace(clock=SimpleNamespace(budget=None), epochs=40, start_epoch=12,
                          resume_path=Path("runs/train/exp/weights/last.pt"))
    assert epochs_text(run) == "40 epochs, resumed at epoch 13 from runs/train/exp/weights/last.pt"


@pytest.mark.parametrize(("warmup_epochs", "epochs", "budget", "said"), [
    (3.0, 50, None, ", warm-up 100 steps (12.5 epochs: --warmup-epochs 3, at least 100 steps, at most a quarter of "
                    "the run)"),  # 24 steps asked: the floor raised it
    (3.0, 5, None, ", warm-up 10 steps (1.25 epochs: --warmup-epochs 3, at least 100 steps, at most a quarter of "
                   "the run)"),  # 40 steps: a quarter of 5 epochs is 10
    (20.0, 100, None, ""),  # 160 steps, as asked
    (0.0, 50, None, ""),  # no warm-up
    (3.0, 50, "1h", ""),  # --time: the plan's line says the warm-up
])
def test_the_header_says_a_warmup_the_floor_or_the_cap_changed(warmup_epochs: float, epochs: int, budget: str | None,
                                                               said: str):
    from detector.training.builders import warmup_steps

    schedule = SimpleNamespace(warmup_steps=warmup_steps(warmup_epochs, 8, epochs), steps_per_epoch=8)
    run = SimpleNamespace(config=TrainConfig(warmup_epochs=warmup_epochs, epochs=epochs),
                          step=SimpleNamespace(schedule=schedule), clock=SimpleNamespace(budget=budget))
    assert warmup_text(run) == said


@pytest.mark.parametrize(("epochs", "said"), [
    (30, ", MixUp 0.1 (in the workers), CutMix 0.5 (in the workers)"),
    (10, ""),  # every epoch a close-mosaic one (--close-mosaic 10): nothing is ever mixed
])
def test_the_header_names_mixing_only_where_some_epoch_mixes(epochs: int, said: str):
    from detector.training.header import mixing_text

    assert mixing_text(TrainConfig(epochs=epochs, close_mosaic=10, mixup=0.1, cutmix=0.5)) == said
    assert mixing_text(TrainConfig(epochs=epochs, close_mosaic=10)) == ""
