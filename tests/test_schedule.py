"""The dreaming schedule: cron slots in the user's time zone, the first-start baseline, missed runs
and restarts (a real state file, a fake clock)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from memd.clock import Clock
from memd.dreams.schedule import Schedule
from memd_client.errors import ConfigError

BERLIN = ZoneInfo("Europe/Berlin")


class FakeTime:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def _schedule(tmp_path: Path, clock: FakeTime, cron: str = "0 3 * * *") -> Schedule:
    return Schedule(
        cron,
        state_path=tmp_path / "s" / "dreaming.json",
        clock=Clock("Europe/Berlin", source=clock),
    )


def test_next_run_is_the_next_3am_local(tmp_path: Path) -> None:
    clock = FakeTime(datetime(2024, 7, 1, 12, 0, tzinfo=UTC))  # 14:00 in Berlin (CEST)
    nxt = _schedule(tmp_path, clock).next_run()
    assert nxt == datetime(2024, 7, 2, 3, 0, tzinfo=BERLIN)
    assert nxt.astimezone(UTC) == datetime(2024, 7, 2, 1, 0, tzinfo=UTC)
    clock.now = datetime(2024, 1, 10, 1, 30, tzinfo=UTC)  # 02:30 in Berlin (CET): today's slot
    assert _schedule(tmp_path, clock).next_run().astimezone(UTC) == datetime(
        2024, 1, 10, 2, 0, tzinfo=UTC
    )


def test_next_run_across_the_dst_change(tmp_path: Path) -> None:
    clock = FakeTime(datetime(2024, 3, 30, 12, 0, tzinfo=UTC))
    assert _schedule(tmp_path, clock).next_run().astimezone(UTC) == datetime(
        2024, 3, 31, 1, 0, tzinfo=UTC
    )


def test_first_start_records_a_baseline_and_does_not_run(tmp_path: Path) -> None:
    clock = FakeTime(datetime(2024, 7, 1, 12, 0, tzinfo=UTC))
    sched = _schedule(tmp_path, clock)
    assert sched.due() is False
    assert sched.last_run == clock.now
    saved = json.loads((tmp_path / "s" / "dreaming.json").read_text())
    assert datetime.fromisoformat(saved["last_run"]) == clock.now
    clock.advance(hours=12)  # 02:00 next day in Berlin: not yet
    assert sched.due() is False
    clock.advance(hours=1, minutes=1)  # 03:01
    assert sched.due() is True


def test_a_missed_run_runs_once(tmp_path: Path) -> None:
    clock = FakeTime(datetime(2024, 7, 1, 12, 0, tzinfo=UTC))
    sched = _schedule(tmp_path, clock)
    sched.mark_ran()
    clock.advance(days=3)  # memd was down across three 03:00 slots
    assert sched.due() is True
    sched.mark_ran()
    assert sched.due() is False
    clock.advance(hours=12)  # 02:00 local next day
    assert sched.due() is False
    clock.advance(hours=1)  # 03:00 local: the next slot
    assert sched.due() is True


def test_restart_keeps_the_last_run(tmp_path: Path) -> None:
    clock = FakeTime(datetime(2024, 7, 1, 12, 0, tzinfo=UTC))
    first = _schedule(tmp_path, clock)
    first.mark_ran(datetime(2024, 7, 1, 1, 30, tzinfo=UTC))
    again = _schedule(tmp_path, clock)
    assert again.last_run == datetime(2024, 7, 1, 1, 30, tzinfo=UTC)
    assert again.due() is False  # the 03:00 slot of 1 July ran at 01:30 UTC (03:30 local)
    clock.advance(days=1)
    restarted = _schedule(tmp_path, clock)
    assert restarted.due() is True


def test_a_clock_that_went_back_does_not_postpone_runs(tmp_path: Path) -> None:
    clock = FakeTime(datetime(2024, 7, 1, 12, 0, tzinfo=UTC))
    sched = _schedule(tmp_path, clock)
    sched.mark_ran(datetime(2030, 1, 1, tzinfo=UTC))
    assert sched.due() is False
    clock.advance(days=1)
    assert sched.due() is True


def test_unreadable_state_is_a_fresh_start(tmp_path: Path) -> None:
    state = tmp_path / "s" / "dreaming.json"
    state.parent.mkdir()
    state.write_text("{not json")
    clock = FakeTime(datetime(2024, 7, 1, 12, 0, tzinfo=UTC))
    sched = _schedule(tmp_path, clock)
    assert sched.last_run is None and sched.due() is False
    assert json.loads(state.read_text())["last_run"]
    assert [p.name for p in state.parent.iterdir()] == ["dreaming.json"]


def test_machine_local_zone_when_none_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    clock = FakeTime(datetime(2024, 7, 1, 12, 0, tzinfo=UTC))  # 21:00 in Tokyo
    sched = Schedule("0 3 * * *", state_path=tmp_path / "d.json", clock=Clock(source=clock))
    assert sched.next_run().astimezone(UTC) == datetime(2024, 7, 1, 18, 0, tzinfo=UTC)


@pytest.mark.parametrize("cron", ["", "not cron", "61 3 * * *", "0 3 * *"])
def test_invalid_cron_is_a_config_error(tmp_path: Path, cron: str) -> None:
    with pytest.raises(ConfigError):
        Schedule(cron, state_path=tmp_path / "d.json")
