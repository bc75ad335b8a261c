import csv
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from detector.data.device_augment import WarpBatch
from detector.data.sampler import EpochSampler
from detector.training.feed import EpochFeed, upload_stream, uploaded_ahead


class _Keys(Dataset):
    """Returns the sampler's key itself: which epoch and mosaic setting each item was drawn for."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, key: tuple[int, int, bool]) -> tuple[int, int, bool]:
        return key


def _keys(batches) -> list[tuple[int, int, bool]]:
    return [(int(index), int(epoch), bool(mosaic)) for batch in batches for index, epoch, mosaic in zip(*batch)]


@pytest.mark.parametrize("workers", [0, 2])
def test_each_epoch_gets_its_own_keys_whenever_its_pass_began(workers: int):
    sampler = EpochSampler(6, seed=3, batch=2)
    loader = DataLoader(_Keys(), batch_size=2, sampler=sampler, num_workers=workers, persistent_workers=workers > 0,
                        timeout=60 if workers else 0)  # a worker that hangs fails the test instead
    feed = EpochFeed(sampler, loader)
    try:
        expected = {}
        for epoch, mosaic in ((0, True), (1, True), (2, False)):
            sampler.set_epoch(epoch, use_mosaic=mosaic)
            expected[epoch] = [(index, epoch, mosaic) for index, _, _ in sampler]  # the shuffle of that epoch

        first = feed.begin(0, use_mosaic=True)
        drawn = next(first)  # as the AMP check draws it
        feed.put_back([drawn])
        batches = feed.epoch(0, use_mosaic=True)
        assert len(batches) == 3 and _keys(batches) == expected[0]  # the drawn batch first, then the rest, once

        feed.begin(1, use_mosaic=True)  # begun early, as after an epoch's training
        if workers:  # a later change of the sampler never reaches a pass whose workers began (none do without)
            sampler.set_epoch(7, use_mosaic=False)
        assert _keys(feed.epoch(1, use_mosaic=True)) == expected[1]

        feed.begin(2, use_mosaic=True)  # begun for other keys (a re-planned close of mosaic): begun anew
        assert _keys(feed.epoch(2, use_mosaic=False)) == expected[2]

        feed.begin(0, use_mosaic=True)
        next(feed.begin(0, use_mosaic=True))
        feed.forget()  # drawn from and not put back: the epoch begins anew, whole
        assert _keys(feed.epoch(0, use_mosaic=True)) == expected[0]
    finally:
        feed.stop()


def test_beginning_epochs_early_changes_no_batch_of_a_run(tmp_path: Path, monkeypatch):
    """The same run, with each epoch's pass begun early (the default) and begun only when the epoch starts: the
    same losses and metrics in every digit results.csv keeps (workers seed augmentation from the sampler's keys
    alone)."""
    from detector.training.config import TrainConfig
    from detector.training.trainer import train
    from tests.conftest import write_yolo_dataset

    data = write_yolo_dataset(tmp_path / "data", train=8, val=2)
    settings = dict(data=str(data), device="cpu", imgsz=64, epochs=2, batch=4, workers=2, cache="none",
                    project=str(tmp_path), plots=False, amp_check=False, close_mosaic=1, seed=0, warmup_epochs=0.5)
    early = train(TrainConfig(**settings, name="early"), progress=False)
    began = []
    real_epoch = EpochFeed.epoch

    def at_the_epochs_start(self, epoch, *, use_mosaic):
        began.append(self._begun is not None)
        self.forget()  # whatever began earlier is dropped: the pass begins here, as before the feed existed
        return real_epoch(self, epoch, use_mosaic=use_mosaic)

    monkeypatch.setattr(EpochFeed, "epoch", at_the_epochs_start)
    late = train(TrainConfig(**settings, name="late"), progress=False)
    assert began == [True, True]  # epoch 0 from its first batch's pass (the batch plot's); 1 begun before validation
    columns = ("train/box", "train/cls", "train/dfl", "lr", "mAP50-95", "mAP50", "precision", "optimizer_steps")
    rows = [[{c: row[c] for c in columns} for row in csv.DictReader((run["run_dir"] / "results.csv").open())]
            for run in (early, late)]
    assert len(rows[0]) == 2 and rows[0] == rows[1]


def _batches(count: int) -> list[tuple[object, torch.Tensor, list[int]]]:
    """Loader-like batches: a uint8 image tensor or a WarpBatch, targets, metas; every value distinct."""
    out = []
    for index in range(count):
        pixels = torch.full((2, 3, 8, 8), index, dtype=torch.uint8)
        images = pixels if index % 2 else WarpBatch(pixels[0].permute(1, 2, 0).contiguous(),
                                                     torch.full((2, 2, 3), float(index)), torch.zeros(2, 4), 8)
        out.append((images, torch.tensor([[index, 0, 0.5, 0.5, 0.1, 0.1]]), [index]))
    return out


def test_uploading_ahead_on_the_cpu_hands_out_the_batches_themselves():
    batches = _batches(3)
    handed = list(uploaded_ahead(iter(batches), torch.device("cpu")))
    assert len(handed) == 3 and all(a is b for a, b in zip(handed, batches))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_uploading_ahead_hands_each_batch_on_the_gpu_in_order_and_one_ahead():
    device = torch.device("cuda")
    batches = _batches(5)
    asked = []

    def loader():
        for index, batch in enumerate(batches):
            asked.append(index)
            yield tuple(part.pin_memory() if isinstance(part, (torch.Tensor, WarpBatch)) else part for part in batch)

    for index, (images, targets, metas) in enumerate(uploaded_ahead(loader(), device)):
        assert asked == list(range(min(index + 2, len(batches))))  # the next batch is copied while this one steps
        expected = batches[index][0]
        if isinstance(expected, WarpBatch):
            assert images.atlas.device.type == "cuda" and images.out_size == expected.out_size
            assert torch.equal(images.atlas.cpu(), expected.atlas) and torch.equal(images.theta.cpu(), expected.theta)
        else:
            assert images.device.type == "cuda" and torch.equal(images.cpu(), expected)
        assert targets.device.type == "cpu" and torch.equal(targets, batches[index][1]) and metas == [index]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_epochs_upload_on_one_stream_and_reuse_its_memory():
    """Each epoch's copies go on the GPU's one upload stream, so the blocks the epoch before freed are given again
    instead of new ones: reserved memory stays level over epochs (a stream per epoch took ~3 new blocks each)."""
    device = torch.device("cuda")
    images = torch.zeros(16, 3, 512, 512, dtype=torch.uint8).pin_memory()  # 12 MiB a batch
    assert upload_stream(device) is upload_stream(torch.device("cuda", torch.cuda.current_device()))

    def epoch() -> None:
        for moved, _, _ in uploaded_ahead(((images, None, None) for _ in range(4)), device):
            moved.float().sum()  # read on the step's stream, as training does
            # Each batch's read done before the next upload: a freed block is given again only once the reads
            # recorded on it have run, so without this an epoch takes 3 or 4 blocks as the GPU's timing falls.
            torch.cuda.current_stream(device).synchronize()
        torch.cuda.synchronize()

    epoch()
    reserved = torch.cuda.memory_reserved(device)
    for _ in range(3):
        epoch()
    assert torch.cuda.memory_reserved(device) == reserved
