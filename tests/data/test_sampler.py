import math

import numpy as np
import pytest

from detector.data.letterbox import rect_batches
from detector.data.sampler import EpochSampler, RectBatchSampler


def test_a_pass_keeps_the_keys_it_began_with():
    """The trainer begins an epoch's pass before the epoch (detector/training/feed.py); a set_epoch while a pass
    is under way (its later indices drawn lazily, as the loader draws them) never changes that pass's keys."""
    sampler = EpochSampler(10, seed=1)
    sampler.set_epoch(3, use_mosaic=True)
    expected = list(sampler)
    keys = iter(sampler)
    first = next(keys)
    sampler.set_epoch(4, use_mosaic=False)
    assert [first, *keys] == expected and {(epoch, mosaic) for _, epoch, mosaic in expected} == {(3, True)}
    assert {(epoch, mosaic) for _, epoch, mosaic in sampler} == {(4, False)}  # the next pass takes the new keys


# --rect: RectBatchSampler over rect_batches' cut (detector/data/letterbox.py), at 64 px and batch 4.
# Aspect ratios (h / w) 0.5, 1 and 2 give three canvases at 64 px: 32x64, 64x64 and 64x32 (height x width).
MIXED_HW = [(32, 64)] * 9 + [(64, 64)] * 6 + [(64, 32)] * 10 + [(40, 64)] * 4  # 29 images: 8 batches, one partial


def rect_sampler(image_hw: list[tuple[int, int]], batch: int = 4, **kwargs) -> tuple[RectBatchSampler, np.ndarray]:
    order, canvases = rect_batches(np.array(image_hw), 64, batch, 32)
    return RectBatchSampler(order, canvases, batch=batch, **kwargs), canvases


def epoch_keys(sampler: RectBatchSampler, epoch: int) -> list[list[tuple[int, int, bool]]]:
    sampler.set_epoch(epoch, use_mosaic=False)
    return list(sampler)


def test_rect_batches_are_whole_share_one_canvas_and_hold_every_image_each_epoch():
    sampler, canvases = rect_sampler(MIXED_HW)
    size = len(MIXED_HW)
    assert len(sampler) == 8 and sampler.input_shapes() == [(4, 32, 64), (4, 64, 32), (4, 64, 64)]
    for epoch in range(3):
        batches = epoch_keys(sampler, epoch)
        assert len(batches) == len(sampler) and all(len(batch) == 4 for batch in batches)
        assert {key[1:] for batch in batches for key in batch} == {(epoch, False)}
        for batch in batches:
            assert len({tuple(canvases[index % size]) for index, _, _ in batch}) == 1, batch
        indices = [index for batch in batches for index, _, _ in batch]
        assert sorted({index % size for index in indices}) == list(range(size))  # every image, every epoch
        assert len(set(indices)) == len(indices)  # a repeat has a key of its own


def test_a_partial_batch_is_filled_with_repeats_of_its_own_members():
    """29 images in batches of 4: 7 whole, one of 1 image; it keeps its canvas with 3 repeats of that image, each
    keyed past the dataset's size (index + 29 k: draws of its own, as EpochSampler's repeats)."""
    sampler, canvases = rect_sampler(MIXED_HW)
    size = len(MIXED_HW)
    for epoch in range(2):
        partial = [batch for batch in epoch_keys(sampler, epoch) if any(index >= size for index, _, _ in batch)]
        assert len(partial) == 1
        indices = [index for index, _, _ in partial[0]]
        own = [index for index in indices if index < size]
        assert len(own) == 1 and indices == [own[0] + size * k for k in range(4)]


def test_the_batches_order_is_shuffled_per_epoch_and_replayed_per_seed_and_epoch():
    """Ultralytics runs one fixed order of rect batches every epoch; here the order changes with the epoch and is
    the same again for the same (seed, epoch): every rank, and a resumed run, draws it alike."""
    sampler, _ = rect_sampler(MIXED_HW, seed=3)
    first, second = epoch_keys(sampler, 0), epoch_keys(sampler, 1)
    canvases_of = [[tuple(map(int, c)) for c in (rect_sampler(MIXED_HW)[1][batch[0][0] % 29] for batch in keys)]
                   for keys in (first, second)]
    assert canvases_of[0] != canvases_of[1]  # the canvases come in another order, not only other members
    assert epoch_keys(rect_sampler(MIXED_HW, seed=3)[0], 1) == second  # a new sampler: the same epoch 1
    assert epoch_keys(rect_sampler(MIXED_HW, seed=4)[0], 1) != second


def test_images_of_one_canvas_are_dealt_anew_among_its_batches():
    """One canvas for all (BCCD's 640x480 images): the batches' members change every epoch, a plain shuffle, as
    Ultralytics keeps its loader's shuffle where every batch has one shape. No image ever changes canvas."""
    sampler, canvases = rect_sampler([(48, 64)] * 16)
    assert sampler.input_shapes() == [(4, 64, 64)]
    members = [{frozenset(index for index, _, _ in batch) for batch in epoch_keys(sampler, epoch)} for epoch in (0, 1)]
    assert members[0] != members[1]
    mixed, canvases = rect_sampler(MIXED_HW)
    for epoch in range(4):
        for batch in epoch_keys(mixed, epoch):
            assert len({tuple(canvases[index % 29]) for index, _, _ in batch}) == 1


def test_each_rank_gets_as_many_whole_batches_and_together_every_image():
    """torchrun: batch i of the epoch's order goes to rank i % world_size; 8 batches over 3 ranks are padded to 9
    with a repeat of the epoch's first batch (its keys past the dataset's size)."""
    size = len(MIXED_HW)
    for world_size in (2, 3):
        shards = [epoch_keys(rect_sampler(MIXED_HW, rank=rank, world_size=world_size)[0], 5)
                  for rank in range(world_size)]
        assert len({len(shard) for shard in shards}) == 1 and len(shards[0]) == math.ceil(8 / world_size)
        assert all(len(batch) == 4 for shard in shards for batch in shard)
        indices = [index for shard in shards for batch in shard for index, _, _ in batch]
        assert sorted({index % size for index in indices}) == list(range(size)) and len(set(indices)) == len(indices)
        whole = rect_sampler(MIXED_HW, world_size=world_size)[0].epoch_batches(5)
        for rank, shard in enumerate(shards):
            assert [[index for index, _, _ in batch] for batch in shard] == whole[rank::world_size]
    padded = rect_sampler(MIXED_HW, world_size=3)[0].epoch_batches(5)
    assert [index % size for index in padded[8]] == [index % size for index in padded[0]]


def test_a_dataset_smaller_than_a_batch_is_one_batch_and_rect_sampler_checks_its_canvases():
    sampler, _ = rect_sampler([(32, 64), (32, 64), (32, 64)], batch=16)
    assert len(sampler) == 1 and [len(batch) for batch in epoch_keys(sampler, 0)] == [3]
    order, canvases = rect_batches(np.array(MIXED_HW), 64, 4, 32)
    with pytest.raises(ValueError, match="every image of a rectangular batch must have the batch's canvas"):
        RectBatchSampler(order, canvases[::-1], batch=4)
