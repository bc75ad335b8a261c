import pytest
import torch
from torch.utils.data import DataLoader

from detector.data.augment import AugmentConfig
from detector.data.build import build_split
from detector.data.dataset import collate
from detector.data.sampler import EpochSampler, samples_per_rank
from detector.data.spec import load_dataset_spec
from detector.training.step_input import step_input
from detector.training.multiscale import MultiScale, images_per_step
from tests.conftest import write_yolo_dataset


def test_default_list_is_short_and_centred_on_imgsz():
    assert MultiScale(320).ladder() == [288, 320, 352]
    assert MultiScale(640).ladder() == [576, 608, 640, 672, 704]
    assert MultiScale(320, low=0.5, high=1.5).ladder() == list(range(160, 481, 32))
    assert MultiScale(320, enabled=False).ladder() == [320]


def test_sizes_come_only_from_the_list_and_are_held_for_hold_steps():
    multi = MultiScale(640, low=0.5, high=1.0, hold=10, epochs=5)
    sizes = multi.sizes(95, seed=3, epoch=1)
    assert set(sizes) <= set(multi.ladder()) and len(set(sizes)) > 1
    blocks = [sizes[start : start + 10] for start in range(0, 95, 10)]
    assert all(len(set(block)) == 1 for block in blocks)  # one size per block of 10 steps, the last one short
    assert len(blocks[-1]) == 5


def test_sizes_depend_on_seed_and_epoch_alone():
    multi = MultiScale(640, low=0.5, high=1.0, hold=2, epochs=10)
    sizes = multi.sizes(100, seed=1, epoch=3)
    assert sizes == MultiScale(640, low=0.5, high=1.0, hold=2, epochs=10).sizes(100, seed=1, epoch=3)
    assert sizes != multi.sizes(100, seed=1, epoch=4)
    assert sizes != multi.sizes(100, seed=2, epoch=3)


def test_size_is_fixed_in_the_close_mosaic_epochs():
    epochs, close_mosaic = 6, 2
    multi = MultiScale(320, low=0.5, hold=1, epochs=epochs, fixed_last_epochs=close_mosaic)
    for epoch in range(epochs):
        use_mosaic = epoch < epochs - close_mosaic  # the trainer's rule
        assert multi.varies_in(epoch) == use_mosaic
        sizes = multi.sizes(50, seed=0, epoch=epoch)
        assert (len(set(sizes)) > 1) if use_mosaic else sizes == [320] * 50
    assert MultiScale(320, epochs=3, fixed_last_epochs=10).sizes(4, seed=0, epoch=0) == [320] * 4
    assert MultiScale(320, epochs=3, enabled=False).input_shapes(steps_per_epoch=5, batch=8, seed=0) == [(8, 320)]


def test_hold_must_be_positive():
    with pytest.raises(ValueError, match="multi-scale-hold"):
        MultiScale(320, hold=0)


def test_each_rank_draws_whole_batches_unless_its_share_is_smaller_than_one():
    assert samples_per_rank(205, 1, 16) == 208 and images_per_step(208, 16) == 16  # 13 full steps, none dropped
    assert samples_per_rank(205, 2, 16) == 112  # 103 each, padded to 7 batches
    assert samples_per_rank(16, 1, 16) == 16
    assert samples_per_rank(3, 1, 16) == 3 and images_per_step(3, 16) == 3  # tiny dataset: its one batch


def test_sampler_pads_with_the_epochs_own_order_and_covers_every_image():
    for world_size in (1, 2):
        shards = [list(EpochSampler(21, seed=0, rank=rank, world_size=world_size, batch=4)) for rank in range(world_size)]
        keys = [key for shard in shards for key in shard]
        assert all(len(shard) % 4 == 0 for shard in shards)
        assert {index % 21 for index, _, _ in keys} == set(range(21))  # every image, every epoch
        assert len(keys) - 21 < 4 * world_size  # no more padding than one batch per rank
        # A repeat's key is its index past the dataset's size (its own draws); each key comes once in the epoch.
        assert len({index for index, _, _ in keys}) == len(keys)
        assert sum(index >= 21 for index, _, _ in keys) == len(keys) - 21


@pytest.mark.parametrize(("images", "batch", "world_size"), [(21, 4, 1), (21, 4, 2), (3, 4, 1)])
def test_shape_count_matches_a_real_loader(tmp_path, images, batch, world_size):
    """Iterate the loader as the trainer builds it, over every epoch and rank, and count the step inputs."""
    spec = load_dataset_spec(write_yolo_dataset(tmp_path, train=images, val=1, size=64))
    data = build_split(spec, "train", image_size=128, augment=AugmentConfig(), cache="ram")
    epochs, close_mosaic = 5, 1
    multi = MultiScale(128, low=0.5, high=1.0, hold=2, epochs=epochs, fixed_last_epochs=close_mosaic)
    for rank in range(world_size):
        seen: set[tuple[int, int]] = set()
        sampler = EpochSampler(images, seed=0, rank=rank, world_size=world_size, batch=batch)
        loader = DataLoader(data.dataset, batch_size=batch, sampler=sampler, collate_fn=collate)
        for epoch in range(epochs):
            sampler.set_epoch(epoch, use_mosaic=epoch < epochs - close_mosaic)
            sizes = multi.sizes(len(loader), seed=0, epoch=epoch)
            shapes = [step_input(batch_images, sizes[index], torch.device("cpu"), channels_last=True).shape
                      for index, (batch_images, _targets, _metas) in enumerate(loader)]
            assert len(shapes) == len(loader) >= 1
            seen.update((shape[0], shape[-1]) for shape in shapes)
        predicted = multi.input_shapes(steps_per_epoch=len(loader), batch=images_per_step(len(sampler), batch), seed=0)
        assert sorted(seen) == predicted  # every rank: exactly the shapes predicted
        assert len({batch_size for batch_size, _ in seen}) == 1  # one batch size: no partial last batch
        assert {size for _, size in seen} <= {64, 96, 128}


def test_the_header_says_when_a_run_is_all_close_mosaic_epochs():
    """A run of --close-mosaic epochs or fewer trains without mosaic and at imgsz throughout: the header says so,
    and how to keep both on; a longer run names its close-mosaic tail."""
    short = MultiScale(640, epochs=2, fixed_last_epochs=10).describe(1)
    assert short.startswith("no mosaic or multi-scale: all 2 epochs are close-mosaic epochs, at 640 px")
    one = MultiScale(640, epochs=1, fixed_last_epochs=10).describe(1)  # it said "all 1 epochs are"
    assert one.startswith("no mosaic or multi-scale: its 1 epoch is a close-mosaic epoch, at 640 px")
    assert "--close-mosaic 10; 0 keeps both on" in short
    long = MultiScale(640, epochs=30, fixed_last_epochs=10).describe(5)
    assert long == ("multi-scale 576-704 px (5 sizes, each held 10 steps; no mosaic and 640 px for the last 10 "
                    "epochs): 5 input shapes")
    assert MultiScale(640, epochs=3, fixed_last_epochs=0).describe(5).endswith("each held 10 steps): 5 input shapes")
    # 160 px: 0.875-1.125 x 160 holds no other multiple of 32 ("1 sizes, each held 10 steps" before)
    assert MultiScale(160, epochs=30, fixed_last_epochs=0).describe(1) == (
        "multi-scale 160 px only (no other multiple of 32 in range): 1 input shape")


def test_largest_is_the_top_of_the_ladder_or_the_close_mosaic_size():
    assert MultiScale(640).largest() == 704
    assert MultiScale(640, enabled=False).largest() == 640
    assert MultiScale(640, low=0.5, high=0.75).largest() == 640  # the close-mosaic epochs train at imgsz
