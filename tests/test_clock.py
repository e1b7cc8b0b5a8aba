"""The Clock: one time zone checked once, now in UTC, the user's day, a time tests fix."""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest

from memd.clock import Clock
from memd_client.errors import ConfigError

LATE_UTC = datetime(2026, 4, 1, 23, 30, tzinfo=UTC)  # already Apr 2 in Tokyo


@pytest.mark.parametrize("name", ["Mars/Olympus", "Not/AZone", "Europe"])
def test_an_unknown_time_zone_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="not a known IANA time zone"):
        Clock(name)


def test_the_day_is_the_zone_s() -> None:
    assert Clock.at(LATE_UTC, "Asia/Tokyo").today() == date(2026, 4, 2)
    assert Clock.at(LATE_UTC, "America/New_York").today() == date(2026, 4, 1)
    assert Clock("Asia/Tokyo").day(LATE_UTC) == date(2026, 4, 2)
    assert Clock.at(LATE_UTC, "Asia/Tokyo").local().tzinfo == ZoneInfo("Asia/Tokyo")


def test_now_is_aware_utc() -> None:
    tokyo = LATE_UTC.astimezone(ZoneInfo("Asia/Tokyo"))
    assert Clock.at(tokyo).now() == LATE_UTC and Clock.at(tokyo).now().tzinfo == UTC
    assert Clock.at(LATE_UTC.replace(tzinfo=None)).now() == LATE_UTC  # naive: UTC
    assert Clock().now().tzinfo == UTC


def test_the_machine_s_zone_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    assert Clock.at(LATE_UTC).today() == date(2026, 4, 2)


def test_another_zone_keeps_the_time_source() -> None:
    moved = Clock.at(LATE_UTC, "America/New_York").in_zone("Asia/Tokyo")
    assert moved.timezone == "Asia/Tokyo" and moved.now() == LATE_UTC
    assert moved.today() == date(2026, 4, 2)
