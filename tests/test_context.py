"""Session-start context, the flush plan, flush-aware appends and the long-term privacy default,
through a real daemon on its socket (time zone and clock set, so "today" is known)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

import memd_client
from memd.clock import Clock
from memd.config import Config, ScopeRule
from memd.daemon import Daemon
from memd.embed.fake import FakeEmbedder
from memd.markdown.context import session_context
from memd_client.errors import PathRefused

from .daemon_fixture import running_daemon

# 2026-04-01 23:30 in UTC is already 2 April in Auckland (UTC+13 in April): the user's day.
NOW = datetime(2026, 4, 1, 23, 30, tzinfo=UTC)
TZ = "Pacific/Auckland"
TODAY, YESTERDAY = "memory/2026-04-02.md", "memory/2026-04-01.md"
GROUP = "agent:main:telegram:group:42"
DIRECT = "agent:main:telegram:dm:7"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nThe user's name is Ana. She is vegetarian.\n")
    (root / YESTERDAY).write_text("# 2026-04-01\n\n- booked the dentist for Friday\n")
    (root / TODAY).write_text("# 2026-04-02\n\n- deploy freeze starts at noon\n")
    (root / "memory" / "2026-03-31.md").write_text("- too old for the context\n")
    return root


def _start(scopes: tuple[ScopeRule, ...] = ()) -> Iterator[Daemon]:
    config = Config.load(timezone=TZ)
    if scopes:
        config = dataclasses.replace(config, scopes=scopes)
    with running_daemon(config, embedder=FakeEmbedder(), clock=Clock.at(NOW, TZ)) as daemon:
        yield daemon


@pytest.fixture
def daemon(ws: Path) -> Iterator[Daemon]:
    yield from _start()


def connect(daemon: Daemon, session_key: str | None = None) -> memd_client.Client:
    identity = {"session_key": session_key} if session_key else None
    return memd_client.Client(daemon.socket_path, 30.0, identity=identity)


def test_context_holds_memory_md_today_and_yesterday_with_citations(
    daemon: Daemon, ws: Path
) -> None:
    with connect(daemon) as c:
        c.workspace_add(str(ws), name="agent")
        ctx = c.context("agent")
    assert ctx["date"] == "2026-04-02"
    assert [s["path"] for s in ctx["sections"]] == ["MEMORY.md", TODAY, YESTERDAY]
    assert [s["citation"] for s in ctx["sections"]] == [
        "MEMORY.md#L1-L3",
        f"{TODAY}#L1-L3",
        f"{YESTERDAY}#L1-L3",
    ]
    assert "She is vegetarian." in ctx["text"] and "deploy freeze" in ctx["text"]
    assert "dentist" in ctx["text"] and "too old" not in ctx["text"]
    assert ctx["text"].startswith("## Long-term memory: MEMORY.md#L1-L3\n# Memory")


def test_a_group_chat_gets_no_long_term_memory_by_default(daemon: Daemon, ws: Path) -> None:
    with connect(daemon) as c:
        c.workspace_add(str(ws), name="agent")
        c.reindex("agent")
    with connect(daemon, GROUP) as group, connect(daemon, DIRECT) as direct:
        assert [s["path"] for s in group.context("agent")["sections"]] == [TODAY, YESTERDAY]
        assert group.context("agent")["longterm"] is False
        assert group.search("agent", "Ana vegetarian", mode="keyword")["results"] == []
        with pytest.raises(PathRefused, match="long-term memory"):
            group.get("agent", "MEMORY.md")
        hits = direct.search("agent", "Ana vegetarian", mode="keyword")["results"]
        assert hits and hits[0]["path"] == "MEMORY.md"
        assert direct.get("agent", "MEMORY.md")["text"].startswith("# Memory")


def test_a_scope_rule_lets_a_group_see_long_term_memory(ws: Path) -> None:
    rule = ScopeRule(action="allow", chat_type="group", sources=("longterm",))
    for daemon in _start((rule,)):
        with connect(daemon, GROUP) as c:
            c.workspace_add(str(ws), name="agent")
            assert c.context("agent")["sections"][0]["path"] == "MEMORY.md"
            assert c.get("agent", "MEMORY.md")["text"].startswith("# Memory")


def test_context_budget_keeps_the_head_of_memory_md_and_the_end_of_daily_logs(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("".join(f"fact {i:02d}\n" for i in range(1, 11)))
    (root / "memory" / "2026-04-02.md").write_text(
        "".join(f"entry {i:02d}\n" for i in range(1, 21))
    )
    day = dt.date(2026, 4, 2)
    # MEMORY.md is 10 lines of 8 characters (80 with newlines): it all fits in 100.
    sections = session_context(root, day=day, max_chars=100)
    assert [(s.path, s.start_line, s.end_line) for s in sections] == [
        ("MEMORY.md", 1, 10),
        ("memory/2026-04-02.md", 19, 20),  # 20 characters left: the last two entries
    ]
    assert sections[1].text == "entry 19\nentry 20" and sections[1].truncated
    assert sum(len(s.text) + 1 for s in sections) <= 100
    # A budget smaller than MEMORY.md keeps its first lines, whole.
    (head,) = session_context(root, day=day, max_chars=30)
    assert (head.start_line, head.end_line, head.total_lines) == (1, 3, 10)
    assert head.text == "fact 01\nfact 02\nfact 03"


def test_context_leaves_out_a_memory_file_that_leads_outside(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    secret = tmp_path / "secret.md"
    secret.write_text("outside the workspace\n")
    (root / "MEMORY.md").symlink_to(secret)
    (root / "memory" / "2026-04-02.md").write_text("- kept\n")
    sections = session_context(root, day=dt.date(2026, 4, 2))
    assert [s.path for s in sections] == ["memory/2026-04-02.md"]


def test_flush_plan_names_todays_log_in_the_users_time_zone(daemon: Daemon, ws: Path) -> None:
    with connect(daemon) as c:
        c.workspace_add(str(ws), name="agent")
        plan = c.flush_plan("agent")
    assert plan["soft_threshold_tokens"] == 4000
    assert plan["force_flush_transcript_bytes"] == 2 * 1024 * 1024
    assert plan["relative_path"] == TODAY and plan["timezone"] == TZ
    prompt = plan["prompt"]
    for rule in (TODAY, "APPEND", "read-only", "MEMORY.md", "DREAMS.md", "timestamped", "NO_REPLY"):
        assert rule in prompt, rule
    assert "2026-04-02-HHMM.md" in prompt and "memory/2026-04-02.md" in plan["system_prompt"]
    assert prompt.endswith(
        "Current time: Thursday, 2026-04-02 12:30 (Pacific/Auckland)\n"
        "Reference UTC: 2026-04-01 23:30 UTC"
    )
    assert "NO_REPLY" in plan["system_prompt"]


def test_append_holds_flush_writes_to_todays_log(daemon: Daemon, ws: Path) -> None:
    with connect(daemon) as c:
        c.workspace_add(str(ws), name="agent")
        before = {p: p.read_bytes() for p in ws.rglob("*.md")}
        for path, why in (
            ("MEMORY.md", "read-only"),
            ("DREAMS.md", "read-only"),
            ("memory/2026-04-02-1530.md", "variants of today"),
            (YESTERDAY, "another day"),
            ("notes/todo.md", "only today's daily log"),
        ):
            with pytest.raises(PathRefused, match=why):
                c.append("agent", "- a durable fact", path=path, flush=True)
        assert {p: p.read_bytes() for p in ws.rglob("*.md")} == before, "nothing was written"
        silent = c.append("agent", "  NO_REPLY\n", path=TODAY, flush=True)
        assert silent["written"] is False and silent["path"] == TODAY
        assert (ws / TODAY).read_bytes() == before[ws / TODAY]
        done = c.append("agent", "- Ana prefers morning meetings", path=TODAY, flush=True)
        assert done["written"] is True and done["path"] == TODAY and done["start_line"] == 4
        assert (ws / TODAY).read_text().endswith("- Ana prefers morning meetings\n")
        # Without flush, NO_REPLY is just text (a user may write it on purpose).
        assert c.append("agent", "NO_REPLY", path=TODAY)["written"] is True


@pytest.mark.parametrize(("query", "first"), [("yesterday", YESTERDAY), ("today", TODAY)])
def test_today_and_yesterday_in_a_search_are_the_users_days(
    daemon: Daemon, tmp_path: Path, query: str, first: str
) -> None:
    """Three logs with the same words: the one of the day a query names comes first, the day
    in the daemon's zone (in UTC it is still 1 April; the machine's own day is months away)."""
    root = tmp_path / "days"
    (root / "memory").mkdir(parents=True)
    for name in ("memory/2026-03-31.md", YESTERDAY, TODAY):
        (root / name).write_text("- checked the deploy pipeline\n")
    with connect(daemon) as c:
        c.workspace_add(str(root), name="days")
        found = c.search("days", f"deploy pipeline {query}", mode="keyword", wait_ms=10_000)
    assert [r["path"] for r in found["results"]][0] == first
