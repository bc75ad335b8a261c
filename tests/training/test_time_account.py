import gc
import json
import time
from pathlib import Path

import pytest

from detector.training.time_account import PARTS, TimeAccount, process_age
from tests.conftest import FakeClock


def test_parts_are_charged_to_the_innermost_phase_and_sum_to_the_wall_clock():
    clock = FakeClock(now=100.0)
    account = TimeAccount(before=2.0, clock=clock)  # 2 s of imports before the account existed
    clock.now += 1.0  # start-up
    account.switch("other")
    with account.phase("training"):
        clock.now += 5.0
    clock.now += 0.5  # other
    with account.phase("checkpoints"):
        clock.now += 0.25
        with account.phase("validation"):  # nested: validation, not checkpoints
            clock.now += 3.0
        clock.now += 0.25
    totals = account.totals()
    assert totals == {"wall": 12.0, "start-up": 3.0, "training": 5.0, "validation": 3.0, "checkpoints": 0.5,
                      "final evaluation": 0.0, "other": 0.5}
    assert account.details["start-up"] == {"imports": 2.0}


def test_an_open_phase_counts_up_to_now_and_an_unknown_part_is_refused():
    clock = FakeClock(now=100.0)
    account = TimeAccount(clock=clock)
    with account.phase("training"):
        clock.now += 4.0
        assert account.totals()["training"] == 4.0
    with pytest.raises(ValueError, match="unknown part 'lunch'"):
        account.switch("lunch")


def test_a_real_clock_account_sums_to_its_wall_clock_and_is_written(tmp_path: Path):
    account = TimeAccount(before=process_age())
    for part in ("training", "validation", "checkpoints", "final evaluation"):
        with account.phase(part), account.detail(part):
            time.sleep(0.01)
    totals = account.save(tmp_path / "time.json")
    assert all(totals[part] >= 0 for part in PARTS)
    # Each switch reads the clock once, and the parts are differences of those readings: their sum telescopes to
    # the wall clock up to float round-off (~1e-16 relative per addition; 1e-9 s leaves room for 10 terms).
    assert sum(totals[part] for part in PARTS) == pytest.approx(totals["wall"], abs=1e-9)
    assert all(totals[part] >= 0.01 for part in ("training", "validation", "checkpoints", "final evaluation"))
    written = json.loads((tmp_path / "time.json").read_text())
    assert written["seconds"] == totals
    assert all(set(written["details"][part]) == {part} for part in ("training", "validation", "checkpoints"))
    table = account.table(totals)
    assert table.splitlines()[0].startswith("time account (wall ") and all(part in table for part in PARTS)


def test_process_age_is_the_time_since_this_process_started():
    age = process_age()
    assert 0 < age < time.monotonic() + 1  # older than nothing, younger than the machine's uptime (plus a tick)


def test_details_belong_to_their_part_and_garbage_collection_to_the_part_it_interrupted(tmp_path: Path):
    clock = FakeClock(now=100.0)
    account = TimeAccount(clock=clock)
    account.watch_collections()
    try:
        with account.phase("checkpoints"):
            with account.detail("state"):
                clock.now += 0.5
            account._on_collection("start", {})  # what gc.callbacks calls around a collection
            clock.now += 1.25
            account._on_collection("stop", {})
    finally:
        account.close()
    assert account.details["checkpoints"] == {"state": 0.5} and account.collections["checkpoints"] == 1.25
    table = account.table()
    assert "(state 0.5 s)" in table.splitlines()[4] and "(garbage collection 1.2 s: checkpoints 1.2 s)" in table
    account.save(tmp_path / "time.json")
    written = json.loads((tmp_path / "time.json").read_text())
    assert written["garbage collection"] == {**dict.fromkeys(PARTS, 0.0), "checkpoints": 1.25}


def test_garbage_collection_spread_over_the_parts_says_so():
    """0.1 s of collections, none of its parts reaching the table's 0.1 s, read "no part 0.1 s"."""
    account = TimeAccount(clock=FakeClock(now=100.0))
    account.collections.update({"start-up": 0.04, "training": 0.04, "validation": 0.02})
    assert account.table().splitlines()[-1] == "  (garbage collection 0.1 s, under 0.05 s in each part)"


def test_a_resumed_runs_time_json_keeps_every_processs_account(tmp_path: Path):
    """The resumed process overwrote the first one's account: now the file's top level is the newest process's (what
    its table printed; readers of ["seconds"] unchanged) and the earlier ones follow, oldest first."""
    path = tmp_path / "time.json"
    for wall in (10.0, 20.0, 30.0):  # the first process, then two resumes
        clock = FakeClock(now=0.0)
        account = TimeAccount(clock=clock)
        clock.now = wall
        account.save(path)
    written = json.loads(path.read_text())
    assert written["seconds"]["wall"] == 30.0
    assert [process["seconds"]["wall"] for process in written["earlier processes"]] == [10.0, 20.0]
    assert all("earlier processes" not in process and "details" in process for process in written["earlier processes"])


def test_real_collections_are_timed_until_the_account_closes_or_another_watches():
    first, second = TimeAccount(), TimeAccount()
    first.watch_collections()
    try:
        gc.collect()
        assert first.collections["start-up"] > 0  # a full pass over this process's objects: microseconds at least
        second.watch_collections()  # the newest run's account takes over
        before = dict(first.collections)
        gc.collect()
        assert first.collections == before and second.collections["start-up"] > 0
    finally:
        second.close()
    before = dict(second.collections)
    gc.collect()
    assert second.collections == before
