import os

import pytest
from torch.utils.data import DataLoader, Dataset

from detector.data.workers import LOWEST_PRIORITY, worker_init
from detector.tuning import on_glibc


class _Niceness(Dataset):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        return os.nice(0)  # the calling process's current niceness


@pytest.mark.skipif(not hasattr(os, "nice"), reason="no process priorities on this platform")
def test_workers_yield_to_cpu_compute_and_keep_priority_otherwise():
    loaders = {
        shares: DataLoader(_Niceness(), num_workers=1, worker_init_fn=worker_init(shares_cores_with_compute=shares))
        for shares in (True, False)
    }
    assert next(iter(loaders[True])).item() == LOWEST_PRIORITY
    assert next(iter(loaders[False])).item() == os.nice(0)


def test_auto_workers_fixed_on_cpu_and_scale_with_cores_on_gpu():
    from detector.data.workers import CPU_TRAINING_WORKERS, MAX_GPU_WORKERS, default_workers

    assert default_workers("cpu", cores=64) == CPU_TRAINING_WORKERS  # the model shares these cores
    assert default_workers("cuda", cores=16) == 15  # one core left for the main process
    assert default_workers("cuda", cores=16, processes_per_node=8) == 1  # torchrun: the node's cores are shared
    assert default_workers("cuda", cores=4, processes_per_node=8) == 1  # never none
    assert default_workers("cuda", cores=128) == MAX_GPU_WORKERS
    assert default_workers("cuda") >= 1  # this machine's own core count


def test_asked_workers_are_capped_at_the_cores_each_process_may_use():
    from detector.data.workers import capped_workers

    assert capped_workers(8, cores=2) == 2  # Ultralytics' workers=8 on a 2-core machine
    assert capped_workers(8, cores=16) == 8 and capped_workers(0, cores=2) == 0  # what fits is kept
    assert capped_workers(8, cores=16, processes_per_node=4) == 4  # torchrun: the node's cores are shared
    assert capped_workers(8, cores=2, processes_per_node=4) == 1  # never none when some were asked


class _SigintDisposition(Dataset):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> bool:
        import signal

        return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.parametrize("shares", [True, False])
def test_workers_ignore_ctrl_c_even_when_forked_after_the_parent_installed_a_handler(shares):
    """The parent's Python handler would otherwise run in each worker (issue 23: one Ctrl-C line per worker)."""
    import signal

    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        loader = DataLoader(_SigintDisposition(), num_workers=1, worker_init_fn=worker_init(shares_cores_with_compute=shares))
        assert next(iter(loader)).item() is True
    finally:
        signal.signal(signal.SIGINT, previous)


class _FaultsOnReallocation(Dataset):
    """Minor page faults of four NumPy allocations after a first one, each 48 MB: above glibc's largest mmap
    threshold (32 MB), so by default each is mapped afresh and faulted in again (4 KiB at a time, or 2 MiB where
    the kernel gives NumPy transparent huge pages); held in the heap, the first one's pages are reused."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        import resource

        import numpy as np

        np.ones(48 << 20, np.uint8)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(4):
            np.ones(48 << 20, np.uint8)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


# The setting is glibc's, and is left alone where the user tuned malloc or preloaded another allocator.
@pytest.mark.skipif(not on_glibc() or "LD_PRELOAD" in os.environ or any(name.startswith(("MALLOC_", "GLIBC_TUNABLES"))
                                                                         for name in os.environ),
                    reason="glibc's malloc, untuned, is not what this process runs on")
def test_workers_keep_freed_memory_in_their_heap():
    # Spawned, not forked: a forked worker would inherit whatever this test process set for itself.
    # timeout: a worker that never answers fails the test in a minute instead of hanging it.
    plain = DataLoader(_FaultsOnReallocation(), num_workers=1, multiprocessing_context="spawn", timeout=60)
    held = DataLoader(_FaultsOnReallocation(), num_workers=1, multiprocessing_context="spawn", timeout=60,
                      worker_init_fn=worker_init(shares_cores_with_compute=False))
    faults = next(iter(plain)).item()
    assert faults >= 4 * 24  # at least one fault per 2 MiB huge page: the measurement sees the remapping
    assert next(iter(held)).item() <= faults // 10


class _Numbers(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


def test_stop_workers_ends_a_persistent_loaders_processes_while_the_loader_lives():
    """A persistent loader's workers live as long as the loader; a run stops them at its end (stop_workers), so
    they never depend on how the process's exit shuts them down (docs/gpu.md: 5 s per worker on a GPU)."""
    from detector.data.workers import stop_workers

    loader = DataLoader(_Numbers(), batch_size=2, num_workers=2, persistent_workers=True)
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]
    processes = list(loader._iterator._workers)  # torch's own: the persistent iterator and its processes
    assert len(processes) == 2 and all(process.is_alive() for process in processes)  # a finished epoch keeps them
    stop_workers(loader)
    assert not any(process.is_alive() for process in processes)
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]  # a later pass starts new workers
    stop_workers(loader)
    stop_workers(loader)  # nothing left to stop: a no-op
    stop_workers(DataLoader(_Numbers()))  # no workers at all: a no-op
    stop_workers(None)


@pytest.fixture(autouse=True)
def no_mappings_kept():
    """Each test starts and ends without the mappings release keeps (a module-level dict of this process)."""
    from detector.data import workers

    workers.forget_mapped()
    yield
    workers.forget_mapped()


def test_batch_pool_reuses_only_released_buffers_and_grows_them():
    from detector.data.workers import BatchPool, release

    pool = BatchPool(2)
    first, first_ticket = pool.tensor((10, 10, 3))
    second, second_ticket = pool.tensor((10, 10, 3))
    assert first_ticket is not None and second_ticket is not None and first_ticket.slot != second_ticket.slot
    third, third_ticket = pool.tensor((10, 10, 3))  # both slots held: a buffer of its own, nothing to free
    assert third_ticket is None
    assert len({t.untyped_storage().data_ptr() for t in (first, second, third)}) == 3
    release(first_ticket)
    again, again_ticket = pool.tensor((9, 10, 3))  # smaller: the released buffer, not a new one
    assert again_ticket == first_ticket and again.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
    release(again_ticket)
    grown, grown_ticket = pool.tensor((40, 10, 3))  # larger than any buffer: the free slot's buffer grows
    assert grown_ticket is not None and grown_ticket.slot == first_ticket.slot
    assert grown.untyped_storage().nbytes() >= 40 * 10 * 3 * BatchPool.GROWTH - 1
    release(None)  # a batch of its own: nothing to free


class _Regions(Dataset):
    """Device-path items whose regions change size from item to item (so pooled buffers are reused and grown)."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int):
        import numpy as np
        import torch

        from detector.data.device_augment import WarpSource

        rows, cols = 12 + 5 * (index % 4), 16 + 3 * (index % 3)
        region = np.random.default_rng(index).integers(0, 256, (rows, cols, 3), dtype=np.uint8)
        to_region = np.diag([cols / 16, rows / 16, 1.0])  # the 16-px output square onto the region
        return WarpSource.of_pixels(region, to_region, 16), torch.zeros((0, 5)), index


@pytest.mark.parametrize("frees", [True, False])
def test_pooled_batches_arrive_intact_whether_or_not_the_consumer_frees_them(frees):
    """The workers' pooled buffers (BatchPool) are written again only once freed: a consumer that frees each batch
    after copying it out (the pin thread's contract) gets the same pixels as one that holds every batch unfreed,
    and both the same as the batches made in this process. Freed, every batch came from the pool; held, the pool
    runs out and the rest get buffers of their own."""
    from detector.data.dataset import collate
    from detector.data.device_augment import render_uint8
    from detector.data import workers
    from detector.data.workers import PREFETCH_FACTOR, release

    dataset = _Regions()
    expected = [render_uint8(collate([dataset[i] for i in range(start, start + 3)])[0]) for start in range(0, 24, 3)]
    # Freed by this loop, after the DataLoader has sent the worker its next index: one buffer more than the
    # pin thread's consumer needs (benchmarks/data_speed.py's pool_slots)
    loader = DataLoader(dataset, batch_size=3, num_workers=1, collate_fn=collate, timeout=60,
                        prefetch_factor=PREFETCH_FACTOR,
                        worker_init_fn=worker_init(shares_cores_with_compute=False, pool_slots=PREFETCH_FACTOR + 1))
    got, held, tickets = [], [], []
    for images, _, _ in loader:
        tickets.append(images.ticket)
        if frees:
            got.append(render_uint8(images))  # copied out ...
            release(images.ticket, images.atlas)  # ... then freed, its mapping kept for the slot's next batch
        else:
            held.append(images)
    got += [render_uint8(images) for images in held]  # read only now: nothing may have written them since
    assert all(a.equal(b) for a, b in zip(got, expected, strict=True))
    if frees:
        assert all(ticket is not None for ticket in tickets)
        assert 0 < len(workers._MAPPED) <= PREFETCH_FACTOR + 1  # a mapping a slot, the worker's buffers' own
        workers.forget_mapped()
        assert not workers._MAPPED
    else:
        assert [ticket is not None for ticket in tickets] == [True] * (PREFETCH_FACTOR + 1) + [False] * 5


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="pinned memory needs CUDA")
def test_pinning_a_warp_batch_frees_its_pooled_buffer():
    import torch

    from detector.data.device_augment import WarpBatch
    from detector.data.workers import BatchPool

    pool = BatchPool(1)
    atlas, ticket = pool.tensor((4, 4, 3))
    atlas.fill_(7)
    batch = WarpBatch(atlas, torch.zeros(1, 2, 3), torch.zeros(1, 4), 4, ticket)
    pinned = batch.pin_memory()
    assert pinned.atlas.is_pinned() and bool((pinned.atlas == 7).all()) and pinned.ticket is None
    assert pool.flags.tolist() == [0] and batch.ticket is None  # freed once
    _, again = pool.tensor((4, 4, 3))  # the slot's next batch ...
    batch.pin_memory()
    assert again is not None and pool.flags.tolist() == [1]  # ... is not freed by pinning the old one again


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="the pin thread needs CUDA")
def test_pooled_batches_through_the_pin_thread_arrive_intact(monkeypatch):
    """The training loader's setting on CUDA: PREFETCH_FACTOR pooled buffers a worker, freed by the DataLoader's pin
    thread (WarpBatch.pin_memory) once copied, in slices on several threads (forced here for these small atlases).
    Every batch the loop receives is what this process makes for the same items."""
    from detector.data import pinned
    from detector.data.dataset import collate

    monkeypatch.setattr(pinned, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(pinned, "COPY_THREADS", 3)
    from detector.data.device_augment import render_uint8
    from detector.data.workers import PREFETCH_FACTOR, stop_workers

    dataset = _Regions()
    expected = [render_uint8(collate([dataset[i] for i in range(start, start + 3)])[0]) for start in range(0, 24, 3)]
    loader = DataLoader(dataset, batch_size=3, num_workers=2, collate_fn=collate, timeout=60, pin_memory=True,
                        prefetch_factor=PREFETCH_FACTOR, persistent_workers=True,
                        worker_init_fn=worker_init(shares_cores_with_compute=False, pool_slots=PREFETCH_FACTOR))
    for _ in range(2):  # a second pass reuses the persistent workers' buffers
        got = [render_uint8(images) for images, _, _ in loader]
        assert all(a.equal(b) for a, b in zip(got, expected, strict=True))
    stop_workers(loader)


def test_mappings_stay_one_per_worker_slot_across_new_workers_and_go_when_a_pooling_loader_stops():
    """release keeps each slot's mapping keyed by worker id and slot: a loader without persistent workers starts
    new workers (new buffers) every pass, whose mappings replace their predecessors'. Stopping a loader that pools
    drops them; stopping one that does not (the validator's) leaves them."""
    from detector.data import workers
    from detector.data.dataset import collate
    from detector.data.workers import PREFETCH_FACTOR, release, stop_workers

    def loader(pool_slots: int, persistent: bool) -> DataLoader:
        return DataLoader(_Regions(), batch_size=3, num_workers=2, collate_fn=collate, timeout=60,
                          persistent_workers=persistent, prefetch_factor=PREFETCH_FACTOR,
                          worker_init_fn=worker_init(shares_cores_with_compute=False, pool_slots=pool_slots))

    pooled = loader(PREFETCH_FACTOR + 1, persistent=False)
    for _ in range(3):
        for images, _, _ in pooled:
            release(images.ticket, images.atlas)
        assert 0 < len(workers._MAPPED) <= 2 * (PREFETCH_FACTOR + 1)  # workers x slots, not that per pass
    other = loader(0, persistent=True)
    next(iter(other))
    stop_workers(other)
    assert workers._MAPPED  # not this loader's
    persistent = loader(PREFETCH_FACTOR + 1, persistent=True)
    for images, _, _ in persistent:
        release(images.ticket, images.atlas)
    stop_workers(persistent)
    assert not workers._MAPPED
