"""The pin thread's copy in slices (detector/data/pinned.py), on the CPU: page-locked memory itself needs CUDA
(tests/data/test_workers.py pins a pooled batch there)."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch

from detector.data import pinned
from detector.data.pinned import MIN_PARALLEL_BYTES, copy_in_slices, copy_threads, pinned_copy


def _random_bytes(count: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (count,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("threads", [2, 3, 4, 9])
def test_a_large_copy_in_slices_is_every_byte_and_runs_on_the_pool(threads: int, monkeypatch) -> None:
    source = _random_bytes(MIN_PARALLEL_BYTES + 3 * 7 + 1).view(-1, 3)  # no size divides into equal slices
    destination = torch.zeros_like(source)
    calls: list[str] = []
    real_copy = torch.Tensor.copy_

    def copy(into: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        calls.append(threading.current_thread().name)
        return real_copy(into, source)

    monkeypatch.setattr(torch.Tensor, "copy_", copy)
    copy_in_slices(destination, source, threads)
    monkeypatch.undo()
    assert destination.equal(source)
    # One copy a slice, at most four: the first on this thread, the others on the pool's.
    here = threading.current_thread().name
    assert len(calls) == min(threads, 4) and calls.count(here) == 1
    assert all(name.startswith("detector-pin-copy") for name in calls if name != here)


def test_small_strided_or_mismatched_copies_take_one_copy() -> None:
    small = _random_bytes(1000)
    into = torch.zeros_like(small)
    copy_in_slices(into, small, 4)
    assert into.equal(small)
    wide = _random_bytes(MIN_PARALLEL_BYTES * 2).view(1024, -1)
    strided = wide.t()  # not contiguous: a flat slice of it would be the wrong bytes
    into = torch.zeros(strided.shape, dtype=torch.uint8)
    copy_in_slices(into, strided, 4)
    assert into.equal(strided)
    floats = torch.zeros(wide.shape, dtype=torch.float32)
    copy_in_slices(floats, wide, 4)  # a dtype conversion, as copy_ does
    assert floats.equal(wide.float())
    row = _random_bytes(MIN_PARALLEL_BYTES).view(1, -1)
    rows = torch.zeros(3, row.shape[1], dtype=torch.uint8)
    copy_in_slices(rows, row, 4)  # broadcast, as copy_ does: flat slices would fill the first row alone
    assert rows.equal(row.expand(3, -1))


def test_pinned_copy_is_a_contiguous_equal_copy() -> None:
    atlas = _random_bytes(3 * 1200 * 2400 + 0).view(1200, 2400, 3)  # ~8.6 MB: sliced
    copied = pinned_copy(atlas, threads=3, pin=False)
    assert copied.is_contiguous() and copied.equal(atlas) and copied.data_ptr() != atlas.data_ptr()


def test_copy_threads_take_a_quarter_of_the_cores_up_to_four() -> None:
    assert [copy_threads(cores) for cores in (1, 2, 4, 8, 16, 64)] == [1, 1, 1, 2, 4, 4]


def _copy_in_child(answers, parent_pool_id: int) -> None:
    source = _random_bytes(MIN_PARALLEL_BYTES + 5, seed=1)
    destination = torch.zeros_like(source)
    copy_in_slices(destination, source, 3)
    answers.put((bool(destination.equal(source)), id(pinned._copier()) != parent_pool_id))


def test_a_forked_child_copies_with_threads_of_its_own(watchdog) -> None:
    """A fork keeps the parent's pool object but none of its threads: without a pool of its own, a child's slices
    would wait for threads that do not exist."""
    copy_in_slices(torch.zeros(MIN_PARALLEL_BYTES, dtype=torch.uint8), _random_bytes(MIN_PARALLEL_BYTES), 3)
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=_copy_in_child, args=(answers, id(pinned._copier())))
    child.start()
    assert answers.get(timeout=60) == (True, True)  # copied, on a pool of its own
    child.join(60)
    assert child.exitcode == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked memory needs CUDA")
def test_a_sliced_copy_into_page_locked_memory_uploads_intact() -> None:
    atlas = _random_bytes(3 * 1200 * 2400).view(1200, 2400, 3)
    copied = pinned_copy(atlas, threads=3)
    assert copied.is_pinned() and copied.equal(atlas)
    assert copied.to("cuda", non_blocking=True).cpu().equal(atlas)
