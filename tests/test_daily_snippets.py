"""Daily-note snippets for the Light phase, cut as OpenClaw cuts them (worked by hand)."""

from __future__ import annotations

from memd.dreams.daily import DailySnippet, daily_snippets

NOTE = """\
# 2026-04-01

## Deploys
- The VPN gateway password rotates every 90 days
  (the runbook is in ops/vpn.md).
- Release train:
  - staging on Tuesdays
  - production on Thursdays
- ok

## Today
Plain line one about the billing service migration.
Plain line two, same thought.
Plain line three.
Plain line four.
Plain line five starts a new chunk.

## Light Sleep
<!-- openclaw:dreaming:light:start -->
- something dreaming wrote
<!-- openclaw:dreaming:light:end -->
"""


def test_list_items_carry_their_heading_parents_and_continuations() -> None:
    got = daily_snippets(NOTE.splitlines())
    assert got[0] == DailySnippet(
        4,
        5,
        "Deploys: The VPN gateway password rotates every 90 days (the runbook is in ops/vpn.md).",
    )
    # "Release train:" only labels its children: no snippet of its own; children name it.
    assert got[1] == DailySnippet(7, 7, "Deploys: Release train: staging on Tuesdays")
    assert got[2] == DailySnippet(8, 8, "Deploys: Release train: production on Thursdays")
    # "- ok" is 2 characters: under the heading it is "Deploys: ok", 11, and kept.
    assert got[3] == DailySnippet(9, 9, "Deploys: ok")


def test_plain_lines_merge_four_at_a_time_and_a_generic_heading_is_no_heading() -> None:
    got = daily_snippets(NOTE.splitlines())
    # "## Today" is generic, so not taken as a heading: the last real one ("Deploys") still
    # names what follows, as in OpenClaw. Lines 12-15 merge (four), line 16 starts anew.
    assert got[4] == DailySnippet(
        12,
        15,
        "Deploys: Plain line one about the billing service migration. Plain line two, same "
        "thought. Plain line three. Plain line four.",
    )
    assert got[5] == DailySnippet(16, 16, "Deploys: Plain line five starts a new chunk.")
    # The block dreaming wrote (and its heading) is not memory.
    assert len(got) == 6 and not any("dreaming wrote" in s.snippet for s in got)


def test_length_limits_and_the_limit() -> None:
    long_line = "x" * 300
    got = daily_snippets(["# Notes", long_line, "short", "- tiny"])
    assert got[0].snippet == "Notes: " + "x" * 273  # cut to 280 with its heading
    assert [s.start_line for s in got] == [2, 4]  # "short" (5 < 8) drops; "Notes: tiny" stays
    many = [f"- item number {i} is long enough" for i in range(10)]
    assert len(daily_snippets(many, limit=3)) == 3
