"""The dates a query names (memd/search/when.py) and how close a day is to them."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memd.search.when import DATE_WIDTH_DAYS, Named, closeness, named_dates

TODAY = datetime.date(2026, 12, 5)


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("What did Maria donate in December 2023?", [Named(2023, 12, None)]),
        ("What did we decide on March 3, 2024?", [Named(2024, 3, 3)]),
        ("on 3rd of March, 2024", [Named(2024, 3, 3)]),
        ("as mentioned on 8th December, 2023", [Named(2023, 12, 8)]),
        ("notes from 2024-03-03", [Named(2024, 3, 3)]),
        ("the deploy on Aug 15th", [Named(None, 8, 15)]),
        ("the meetup on 15 aug", []),  # an abbreviation that is also a word: capitalised only
        ("when did we go camping in June?", [Named(None, 6, None)]),
        ("by Sept. 2024", [Named(2024, 9, None)]),
        ("between August 11 and August 15 2023", [Named(2023, 8, 15), Named(None, 8, 11)]),
        ("what broke yesterday", [Named(2026, 12, 4)]),
        ("what is on today", [Named(2026, 12, 5)]),
        # counted back from today, a Saturday
        ("what did we fix 3 days ago", [Named(2026, 12, 2)]),
        ("the outage two weeks ago", [Named(2026, 11, 21)]),
        ("a day ago", [Named(2026, 12, 4)]),
        ("notes from last Friday", [Named(2026, 12, 4)]),
        ("notes from last saturday", [Named(2026, 11, 28)]),
        ("what changed this week", [Named(2026, 11, 30, 7)]),
        ("what changed last week", [Named(2026, 11, 23, 7)]),
        ("anything in the past week", [Named(2026, 11, 28, 7)]),
        ("the plan for this month", [Named(2026, 12, None)]),
        ("what did we ship last month", [Named(2026, 11, None)]),
        # no date: words that are month names, impossible days, bare numbers
        ("you may 2x it", []),
        ("march 3 miles north", []),
        ("in may", []),
        ("the deadline of 31 June", []),
        ("2024-13-01 is not a day", []),
        ("build 2024 on host 12", []),
    ],
)
def test_named_dates(query: str, names: list[Named]) -> None:
    assert list(named_dates(query, TODAY)) == names


def test_a_date_is_named_once() -> None:
    assert named_dates("May 3, 2024 or 2024-05-03?", TODAY) == (Named(2024, 5, 3),)


def test_29_february_without_a_year_is_a_day_only_in_leap_years() -> None:
    names = named_dates("what happened on Feb 29", TODAY)
    assert names == (Named(None, 2, 29),)
    assert closeness(names, datetime.date(2024, 2, 29)) == 1.0
    assert closeness(names, datetime.date(2023, 3, 1)) == 0.0  # no 29 February in 2023


def test_closeness_is_one_inside_and_falls_to_zero_a_width_away() -> None:
    month = (Named(2023, 12, None),)
    assert closeness(month, datetime.date(2023, 12, 1)) == 1.0
    assert closeness(month, datetime.date(2023, 12, 31)) == 1.0
    assert 0 < closeness(month, datetime.date(2024, 1, 3)) < 1
    assert closeness(month, datetime.date(2023, 11, 30 - DATE_WIDTH_DAYS)) == 0.0
    any_year = (Named(None, 6, 3),)
    assert closeness(any_year, datetime.date(1999, 6, 3)) == 1.0
    assert closeness(any_year, datetime.date(2031, 6, 4)) == pytest.approx(1 - 1 / DATE_WIDTH_DAYS)
    assert closeness((), datetime.date(2023, 6, 3)) == 0.0


@given(
    st.dates(datetime.date(1990, 1, 1), datetime.date(2060, 12, 31)),
    st.dates(datetime.date(1990, 1, 1), datetime.date(2060, 12, 31)),
)
def test_a_named_day_is_read_back_and_closeness_falls_with_distance(
    named: datetime.date, day: datetime.date
) -> None:
    spellings = [
        named.isoformat(),
        f"{named:%B} {named.day}, {named.year}",
        f"{named.day} {named:%B} {named.year}",
        f"{named:%b}. {named.day}, {named.year}",
    ]
    for text in spellings:
        assert named_dates(f"what did we ship on {text}?", TODAY) == (
            Named(named.year, named.month, named.day),
        ), text
    near = closeness((Named(named.year, named.month, named.day),), day)
    gap = abs((day - named).days)
    assert 0.0 <= near <= 1.0
    assert near == pytest.approx(max(0.0, 1 - gap / DATE_WIDTH_DAYS))


@given(st.text(max_size=80))
def test_any_text_parses_without_error(text: str) -> None:
    for named in named_dates(text, TODAY):
        assert 1 <= named.month <= 12
        assert 0.0 <= closeness((named,), TODAY) <= 1.0


@given(st.dates(datetime.date(1990, 1, 8), datetime.date(2060, 12, 31)), st.integers(1, 99))
def test_days_counted_back_land_before_today(today: datetime.date, count: int) -> None:
    one = datetime.timedelta(days=1)
    (ago,) = named_dates(f"what happened {count} days ago", today)
    assert ago.span(today.year) == (today - count * one,) * 2
    for weekday in range(7):
        name = datetime.date(2024, 1, 1 + weekday).strftime("%A")  # 1 January 2024: a Monday
        (last,) = named_dates(f"notes from last {name}", today)
        first, _ = last.span(today.year)
        assert first.weekday() == weekday and 1 <= (today - first).days <= 7
    (this_week,) = named_dates("what changed this week", today)
    (last_week,) = named_dates("what changed last week", today)
    first, end = this_week.span(today.year)
    assert first.weekday() == 0 and first <= today <= end and (end - first).days == 6
    assert last_week.span(today.year) == (first - 7 * one, first - one)
    (month,) = named_dates("what did we ship last month", today)
    start, stop = month.span(today.year)
    assert stop + one == today.replace(day=1) and start.day == 1
