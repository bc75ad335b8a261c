"""Run folders are claimed atomically; results.csv grows through the atomic writer; a failed command leaves no folder."""

from __future__ import annotations

import csv
import multiprocessing
import threading
from pathlib import Path

import pytest

from detector.runs import append_results, claim_run_dir, keep_results_through, last_results_epoch, run_folder


def test_threads_started_at_once_get_different_folders(tmp_path: Path) -> None:
    start, claimed = threading.Barrier(8), []

    def claim() -> None:
        start.wait()  # all eight call claim_run_dir at the same moment
        claimed.append(claim_run_dir(tmp_path, "exp"))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(claimed) == 8 and len(set(claimed)) == 8
    assert sorted(p.name for p in claimed) == sorted(["exp"] + [f"exp{n}" for n in range(2, 9)])


def _claim_in_process(project: str, start, queue) -> None:
    start.wait()
    queue.put(str(claim_run_dir(project, "exp")))


def test_processes_started_at_once_get_different_folders(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    start, queue = context.Barrier(4), context.Queue()
    processes = [context.Process(target=_claim_in_process, args=(str(tmp_path), start, queue)) for _ in range(4)]
    for process in processes:
        process.start()
    names = {Path(queue.get(timeout=60)).name for _ in processes}
    for process in processes:
        process.join(timeout=30)
    assert names == {"exp", "exp2", "exp3", "exp4"}


def test_a_taken_name_is_skipped_and_a_file_of_that_name_too(tmp_path: Path) -> None:
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp2").write_text("a file, not a folder")
    assert claim_run_dir(tmp_path, "exp") == tmp_path / "exp3"
    assert claim_run_dir(tmp_path / "new" / "project", "exp").is_dir()  # parents are made


def test_a_failing_block_removes_the_folder_it_claimed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="boom"):
        with run_folder(tmp_path, "exp") as folder:
            (folder / "half.txt").write_text("written before the failure")
            raise ValueError("boom")
    assert not any(tmp_path.iterdir())
    with run_folder(tmp_path, "exp") as folder:
        (folder / "kept.txt").write_text("done")
    assert (tmp_path / "exp" / "kept.txt").is_file()


def test_results_csv_gets_one_header_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    append_results(path, {"epoch": 0, "loss": 1.23456789})
    append_results(path, {"epoch": 1, "loss": 0.5})
    assert path.read_bytes() == b"epoch,loss\r\n0,1.23457\r\n1,0.5\r\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]


def test_a_resumed_run_with_a_new_column_keeps_every_column_under_its_name(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    append_results(path, {"epoch": 0, "epoch_seconds": 2.0, "peak_mem_mb": 100.0})  # written by an older version
    append_results(path, {"epoch": 1, "epoch_seconds": 3.0, "data_wait": 0.25, "peak_mem_mb": 120.0})
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["epoch", "epoch_seconds", "peak_mem_mb", "data_wait"]
    assert rows[0] == {"epoch": "0", "epoch_seconds": "2", "peak_mem_mb": "100", "data_wait": ""}
    assert rows[1] == {"epoch": "1", "epoch_seconds": "3", "peak_mem_mb": "120", "data_wait": "0.25"}


def test_a_resume_drops_the_rows_of_epochs_it_trains_again(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    assert keep_results_through(path, 3) == 0  # no file yet
    for epoch in range(1, 6):
        append_results(path, {"epoch": epoch, "loss": 1 / epoch, "evaluator": "faster-coco-eval 1.8.0"})
    before = path.read_bytes()
    assert keep_results_through(path, 7) == 5 and path.read_bytes() == before  # nothing to drop: untouched
    assert keep_results_through(path, 3) == 3
    assert path.read_bytes() == before[: before.index(b"\r\n4,")] + b"\r\n"  # the first rows, byte for byte
    append_results(path, {"epoch": 4, "loss": 0.3, "evaluator": "faster-coco-eval 1.8.0"})
    assert [row["epoch"] for row in csv.DictReader(path.open())] == ["1", "2", "3", "4"]
    assert last_results_epoch(path) == 4 and last_results_epoch(tmp_path / "missing.csv") == 0


def test_a_project_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "photo.jpg").write_bytes(b"...")
    with pytest.raises(NotADirectoryError, match=r"photo.jpg: --project names a file, not a folder"):
        claim_run_dir(tmp_path / "photo.jpg", "exp")  # was "[Errno 17] File exists: '.../photo.jpg'"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../escaped", "/abs"])
def test_a_name_that_is_not_one_folder_name_is_one_line(tmp_path: Path, name: str) -> None:
    """``--name a/b`` failed as "[Errno 2] No such file or directory"; "" and "." made folders "2" and ".2"; "../x"
    and "/x" wrote outside --project."""
    with pytest.raises(ValueError, match=r"--name .*: a run's name is one folder name .*put the folders above it in "
                                         r"--project$"):
        claim_run_dir(tmp_path / "runs", name)
    assert not (tmp_path / "runs").exists()
    assert claim_run_dir(tmp_path / "runs", "exp.v2 (final)") == tmp_path / "runs" / "exp.v2 (final)"
