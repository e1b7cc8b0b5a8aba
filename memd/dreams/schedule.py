"""When scheduled promotion is due: a cron expression in the user's time zone, and the last run kept
in a small state file so a restart neither repeats nor forgets a run."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime
from pathlib import Path

from croniter import croniter

from memd.atomicfile import write_atomic
from memd.clock import Clock
from memd_client.errors import ConfigError

__all__ = ["Schedule"]

logger = logging.getLogger(__name__)


class Schedule:
    """A cron schedule that runs once per due slot; slots missed while memd was down run once."""

    def __init__(
        self,
        cron: str,
        *,
        state_path: Path,
        clock: Clock | None = None,
    ) -> None:
        if not croniter.is_valid(cron):
            raise ConfigError(f"dreaming schedule {cron!r} is not a valid cron expression")
        self.clock = clock or Clock()
        self.cron = cron
        self.state_path = state_path
        self._lock = threading.Lock()
        self._last_run = self._load()

    @property
    def last_run(self) -> datetime | None:
        """When the schedule last ran (or was first started), if ever."""
        return self._last_run

    def _slot_after(self, moment: datetime) -> datetime:
        nxt = croniter(self.cron, self.clock.local(moment)).get_next(datetime)
        assert isinstance(nxt, datetime)
        return nxt

    def next_run(self) -> datetime:
        """The first scheduled slot after now, in the schedule's time zone."""
        return self._slot_after(self.clock.now())

    def due(self) -> bool:
        """Say whether a slot lies in (last run, now]; the first call only records a baseline."""
        now = self.clock.now()
        with self._lock:
            last = self._last_run
            if last is None:
                # No run for slots before memd ever ran: start counting from now.
                logger.info(
                    "dreaming schedule %r starts; first run at %s", self.cron, self.next_run()
                )
                self._save(now)
                return False
            if last > now:  # the clock went back: do not wait for it to catch up
                logger.warning("last dreaming run %s is in the future; counting from now", last)
                self._save(now)
                last = now
        return self._slot_after(last) <= now

    def mark_ran(self, when: datetime | None = None) -> None:
        """Record a run at ``when`` (default now): slots up to then are done."""
        moment = when or self.clock.now()
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        with self._lock:
            self._save(moment)

    def _load(self) -> datetime | None:
        try:
            raw = json.loads(self.state_path.read_text(encoding="utf-8"))
            last = datetime.fromisoformat(raw["last_run"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring unreadable schedule state %s: %s", self.state_path, exc)
            return None
        return last if last.tzinfo is not None else last.replace(tzinfo=UTC)

    def _save(self, moment: datetime) -> None:
        """Write the state file atomically (temp file, fsync, rename, fsync the directory)."""
        self._last_run = moment
        data = json.dumps({"last_run": moment.astimezone(UTC).isoformat()}) + "\n"
        write_atomic(self.state_path, data.encode("utf-8"))
