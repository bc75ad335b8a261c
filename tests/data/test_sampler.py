from detector.data.sampler import EpochSampler


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
