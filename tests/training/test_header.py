from pathlib import Path
from types import SimpleNamespace

import pytest

from detector.training.config import TrainConfig
from detector.training.header import epochs_text, lr_text


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
