"""Caller identity and scope rules: who may search which sources."""

from __future__ import annotations

import pytest

from memd.config import Config, ScopeRule
from memd.scopes import Caller, allowed_sources, is_longterm
from memd_client.errors import BadRequest, ConfigError

ALL = {"longterm", "memory", "sessions"}


def test_session_key_fills_identity() -> None:
    c = Caller.from_params({"session_key": "agent:main:telegram:dm:42"})
    assert (c.agent_id, c.channel, c.chat_type) == ("main", "telegram", "direct")
    explicit = Caller.from_params({"session_key": "agent:main:slack:group:x", "agent_id": "other"})
    assert explicit.agent_id == "other" and explicit.chat_type == "group"
    assert Caller.from_params({"session_key": "not-a-key"}).agent_id == ""
    assert Caller.from_params(None) == Caller()
    with pytest.raises(BadRequest):
        Caller.from_params({"agent_id": 7})


def test_merged_override() -> None:
    base = Caller(agent_id="a", chat_type="direct")
    assert base.merged(Caller(chat_type="group")) == Caller(agent_id="a", chat_type="group")


def test_no_rules_allow_everything() -> None:
    assert allowed_sources(Caller(), ()) == ALL


def test_long_term_memory_is_withheld_from_shared_chats_by_default() -> None:
    for chat in ("group", "channel"):
        assert allowed_sources(Caller(chat_type=chat), ()) == {"memory", "sessions"}
    for caller in (Caller(), Caller(chat_type="direct"), Caller(session_key="agent:main:main")):
        assert allowed_sources(caller, ()) == ALL
    # A session key says the chat type too.
    assert "longterm" not in allowed_sources(
        Caller.from_params({"session_key": "agent:a:tg:group:7"}), ()
    )


def test_a_scope_rule_gives_shared_chats_long_term_memory_back() -> None:
    rules = (ScopeRule(action="allow", chat_type="group", sources=("longterm",)),)
    assert allowed_sources(Caller(chat_type="group"), rules) == ALL
    assert "longterm" not in allowed_sources(Caller(chat_type="channel"), rules)


def test_first_matching_rule_wins_per_source() -> None:
    rules = (
        ScopeRule(action="allow", channel="ops", sources=("longterm",)),
        ScopeRule(action="deny", chat_type="group", sources=("longterm", "sessions")),
    )
    group = Caller(chat_type="group", channel="slack")
    ops_group = Caller(chat_type="group", channel="ops")
    assert allowed_sources(group, rules) == {"memory"}
    assert allowed_sources(ops_group, rules) == {"longterm", "memory"}
    assert allowed_sources(Caller(chat_type="direct"), rules) == ALL


def test_direct_chats_only_example() -> None:
    """The reference's shipped scope: deny everything except direct chats."""
    rules = (
        ScopeRule(action="allow", chat_type="direct"),
        ScopeRule(action="deny"),
    )
    assert allowed_sources(Caller(chat_type="direct"), rules) == ALL
    assert allowed_sources(Caller(chat_type="group"), rules) == set()
    assert allowed_sources(Caller(), rules) == set()


def test_key_prefix_rule() -> None:
    rules = (ScopeRule(action="deny", key_prefix="agent:bot:", sources=("sessions",)),)
    assert "sessions" not in allowed_sources(Caller(session_key="agent:bot:x:dm:1"), rules)
    assert "sessions" in allowed_sources(Caller(session_key="agent:main:x:dm:1"), rules)


def test_longterm_paths() -> None:
    assert is_longterm("MEMORY.md") and is_longterm("memory.md")
    assert not is_longterm("memory/2026-01-01.md")


def test_scopes_from_toml(memd_home: object, tmp_path: object) -> None:
    from pathlib import Path

    home = Path(str(memd_home))
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text(
        '[[scopes]]\naction = "deny"\nchat_type = "group"\nsources = ["longterm"]\n'
    )
    assert Config.load().scopes == (
        ScopeRule(action="deny", chat_type="group", sources=("longterm",)),
    )
    (home / "config" / "config.toml").write_text('[[scopes]]\naction = "deny"\nsources = ["x"]\n')
    with pytest.raises(ConfigError, match="scopes\\[0\\].sources"):
        Config.load()
    (home / "config" / "config.toml").write_text('[[scopes]]\nchat_type = "group"\n')
    with pytest.raises(ConfigError, match="action is required"):
        Config.load()
