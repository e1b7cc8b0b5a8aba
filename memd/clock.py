"""The one notion of now and of the user's day that memd keeps: a :class:`Clock`.

It is made once, by the composition root (memd/daemon/), from the configured time zone, and
handed to every part that stamps a time or names a day: appends to the daily log, recall days,
dreaming runs and their schedule, the flush plan. The zone is checked once, here, so a part
never has to; a test fixes the time by giving the Clock its own ``source``.

Its own module, below everything that uses it: it depends on nothing else of memd, and parts
of several layers (dreams, the writer, ipc, the daemon) share it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from memd_client.errors import ConfigError

__all__ = ["Clock", "local_zone"]


def local_zone() -> tzinfo:
    """The machine's zone with its DST rules when they can be found, else today's fixed offset."""
    name = os.environ.get("TZ", "").lstrip(":")
    with contextlib.suppress(ZoneInfoNotFoundError, ValueError, OSError):
        if name:
            return ZoneInfo(name)
        with open("/etc/localtime", "rb") as f:
            return ZoneInfo.from_file(f, key="localtime")
    return datetime.now().astimezone().tzinfo or UTC


def _zone(timezone: str) -> tzinfo:
    if not timezone:
        return local_zone()
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ConfigError(f"timezone {timezone!r} is not a known IANA time zone") from exc


@dataclass(frozen=True)
class Clock:
    """Now, and the user's day, in one time zone.

    ``timezone``: an IANA name; empty is the machine's local zone. An unknown name raises
    ConfigError when the Clock is made. ``source``: where now comes from (the system clock
    when None); tests pass their own to fix or move the time.
    """

    timezone: str = ""
    source: Callable[[], datetime] | None = field(default=None, compare=False)
    zone: tzinfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "zone", _zone(self.timezone))

    @classmethod
    def at(cls, moment: datetime, timezone: str = "") -> Clock:
        """A Clock stopped at ``moment`` (tests)."""
        return cls(timezone, source=lambda: moment)

    def in_zone(self, timezone: str) -> Clock:
        """This Clock's time in another zone (a reloaded configuration's)."""
        return dataclasses.replace(self, timezone=timezone)

    def now(self) -> datetime:
        """Now, aware, in UTC (a source's naive time is taken as UTC)."""
        if self.source is None:
            return datetime.now(UTC)
        moment = self.source()
        return moment.astimezone(UTC) if moment.tzinfo is not None else moment.replace(tzinfo=UTC)

    def local(self, moment: datetime | None = None) -> datetime:
        """``moment`` (default now) in the user's time zone."""
        return (moment or self.now()).astimezone(self.zone)

    def day(self, moment: datetime) -> date:
        """The user's date at ``moment``."""
        return self.local(moment).date()

    def today(self) -> date:
        """The user's date now."""
        return self.local().date()
