"""Dates a query names, and how close a daily log's day is to them.

"What did Maria donate in December 2023?" and "what did we decide on 3 March?" name the day the
answer was written down, and a daily log (``memory/YYYY-MM-DD.md``) carries that day in its
name: a search adds DATE_WEIGHT to the score of a log of the named day or month, falling to
nothing DATE_WIDTH_DAYS away (memd/search/finish.py). Keyword search
cannot do it ("December" is not a token of ``2023-12-17.md``) and neither can an embedding.

Understood: ISO dates (2024-03-03), English month names and their usual abbreviations with a
day and a year in either order ("March 3, 2024", "3rd of March 2024"), a month and year
("December 2023"), a day and month without a year ("Aug 15th", any year), a month alone after
a preposition ("in June", any year), and days counted from the user's today: "today",
"yesterday", "3 days ago", "two weeks ago", "last Friday", "this week" and "last week" (weeks
start on Monday), "the past week" (the seven days before today), "this month" and "last
month". Month names must be capitalised where they are also words ("May", "March", "Mar",
"Jan" and the rest of the abbreviations) so that "you may 2x it" names no date. Other
languages' month names are not understood; ISO dates work in every language.
"""

from __future__ import annotations

import calendar
import datetime
import re
from dataclasses import dataclass

__all__ = ["DATE_WEIGHT", "DATE_WIDTH_DAYS", "Named", "closeness", "named_dates"]

# Chosen on LoCoMo's tuning conversations and confirmed on the held-out ones (docs/benchmarks.md,
# bench/fusion_study.py --dates): R@5 and MRR were flat from 0.3 to 0.7 and from 3 to 14 days.
DATE_WEIGHT = 0.4
DATE_WIDTH_DAYS = 7

_FULL = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_SHORT = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_SHORT["sept"] = 9
_MONTHS = {**_SHORT, **_FULL}
# Month names that are also English words (or the start of one) count only when capitalised.
_WORDS = {"may", "march", *_SHORT}


def _month_pattern() -> str:
    names = []
    for name in sorted(_MONTHS, key=len, reverse=True):
        if name in _WORDS:
            names.append(f"{name[0].upper()}(?i:{name[1:]})")
        else:
            names.append(f"(?i:{name})")
    return "(" + "|".join(names) + r")\.?"


_MON = _month_pattern()
_DAY = r"(\d{1,2})(?i:st|nd|rd|th)?"
_COUNTS = {"a": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
_WEEKDAYS = [name.lower() for name in calendar.day_name]  # Monday first, as weekday() counts
_YEAR = r"(\d{4})"
_NO_YEAR = r"(?!,?\s*\d)"
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"), "ymd"),
    (re.compile(rf"\b{_MON}\s+{_DAY},?\s+{_YEAR}\b"), "mdy"),
    (re.compile(rf"\b{_DAY}\s+(?i:of\s+)?{_MON},?\s+{_YEAR}\b"), "dmy"),
    (re.compile(rf"\b{_MON},?\s+{_YEAR}\b"), "my"),
    (re.compile(rf"\b{_MON}\s+{_DAY}\b{_NO_YEAR}"), "md"),
    (re.compile(rf"\b{_DAY}\s+(?i:of\s+)?{_MON}\b{_NO_YEAR}"), "dm"),
    (re.compile(rf"\b(?i:in|during|since|until|by|before|after|of)\s+{_MON}\b{_NO_YEAR}"), "m"),
    (re.compile(r"\b(?i:today|yesterday)\b"), "rel"),
    (re.compile(rf"\b(?i:(\d{{1,2}}|{'|'.join(_COUNTS)})\s+(day|week)s?\s+ago)\b"), "ago"),
    (re.compile(r"\b(?i:(last|this|past)\s+(week|month))\b"), "period"),
    (re.compile(rf"\b(?i:last\s+({'|'.join(_WEEKDAYS)}))\b"), "weekday"),
]


@dataclass(frozen=True)
class Named:
    """A day (``days`` from it: a week), or a month, a query names; no year: that day or
    month of any year."""

    year: int | None
    month: int
    day: int | None
    days: int = 1

    @classmethod
    def starting(cls, first: datetime.date, days: int = 1) -> Named:
        return cls(first.year, first.month, first.day, days)

    def span(self, year: int) -> tuple[datetime.date, datetime.date]:
        """The first and last day it names in ``year`` (its own year when it has one)."""
        y = self.year or year
        if self.day is not None:
            d = datetime.date(y, self.month, self.day)
            return d, d + datetime.timedelta(days=self.days - 1)
        last = calendar.monthrange(y, self.month)[1]
        return datetime.date(y, self.month, 1), datetime.date(y, self.month, last)


def named_dates(query: str, today: datetime.date) -> tuple[Named, ...]:
    """The days and months ``query`` names (see the module doc), in order, each once."""
    found: list[Named] = []
    taken: list[tuple[int, int]] = []
    for pattern, kind in _PATTERNS:
        for m in pattern.finditer(query):
            if any(a < m.end() and m.start() < b for a, b in taken):
                continue  # part of a longer date already read ("3 March 2024", not "March")
            named = _read(kind, m.groups(), m.group(0), today)
            if named is None:
                continue
            taken.append((m.start(), m.end()))
            if named not in found:
                found.append(named)
    return tuple(found)


def _read(
    kind: str, groups: tuple[str | None, ...], text: str, today: datetime.date
) -> Named | None:
    g = [x or "" for x in groups]
    if kind in ("rel", "ago", "period", "weekday"):
        return _counted(kind, [x.lower() for x in g], text.lower(), today)
    if kind == "ymd":
        named = Named(int(g[0]), int(g[1]), int(g[2]))
    elif kind == "mdy":
        named = Named(int(g[2]), _MONTHS[g[0].lower()], int(g[1]))
    elif kind == "dmy":
        named = Named(int(g[2]), _MONTHS[g[1].lower()], int(g[0]))
    elif kind == "my":
        named = Named(int(g[1]), _MONTHS[g[0].lower()], None)
    elif kind == "md":
        named = Named(None, _MONTHS[g[0].lower()], int(g[1]))
    elif kind == "dm":
        named = Named(None, _MONTHS[g[1].lower()], int(g[0]))
    else:
        named = Named(None, _MONTHS[g[0].lower()], None)
    try:
        named.span(named.year or 2000)  # a leap year: 29 February without a year is a day
    except ValueError:
        return None  # 31 June, month 13
    return named


def _counted(kind: str, g: list[str], text: str, today: datetime.date) -> Named:
    """A day or span counted back from ``today``."""
    one = datetime.timedelta(days=1)
    if kind == "rel":
        return Named.starting(today - one if text == "yesterday" else today)
    if kind == "ago":
        count = int(g[0]) if g[0].isdigit() else _COUNTS[g[0]]
        return Named.starting(today - count * (7 if g[1] == "week" else 1) * one)
    if kind == "weekday":  # the last such day before today
        back = (today.weekday() - _WEEKDAYS.index(g[0])) % 7 or 7
        return Named.starting(today - back * one)
    which, unit = g
    if which == "past":  # the seven (or thirty) days before today
        length = 7 if unit == "week" else 30
        return Named.starting(today - length * one, length)
    if unit == "week":
        monday = today - today.weekday() * one
        return Named.starting(monday - 7 * one if which == "last" else monday, 7)
    first = today.replace(day=1)
    if which == "last":
        first = (first - one).replace(day=1)
    return Named(first.year, first.month, None)


def closeness(names: tuple[Named, ...], day: datetime.date, width: int = DATE_WIDTH_DAYS) -> float:
    """1 for a day within a named day or month, falling linearly to 0 at ``width`` days before
    or after it; the best over ``names`` (a name without a year: its nearest year)."""
    best = 0.0
    for named in names:
        years = (named.year,) if named.year else (day.year - 1, day.year, day.year + 1)
        for year in years:
            try:
                first, last = named.span(year)
            except ValueError:  # 29 February of a year without one
                continue
            gap = (first - day).days if day < first else (day - last).days if day > last else 0
            best = max(best, 1 - gap / width if gap < width else 0.0)
    return best
