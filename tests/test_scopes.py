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


# Chats other people read, as hosts spell them and as they arrive: any case, surrounding or
# invisible characters, compatibility forms. None of them may get long-term memory by default.
NOT_DIRECT_CHAT_TYPES = [
    "GROUP",
    "Group",
    " group",
    "group\n",
    "\u200bgroup",
    "gro\u200dup",
    "group\ufeff",
    "\u202egroup",
    "ｇｒｏｕｐ",  # fullwidth
    "supergroup",
    "SuperGroup",
    "room",
    "channel",
    "CHANNEL",
    "channel\u00ad",
    "mpim",
    "group_dm",
    "Group DM",
    "guild",
    "space",
    "thread",
    "public",
    "acct",
    "unknown",
    "\u200b",
    " ",
    "dm group",  # not a direct spelling: denied on doubt
    "dіrect",  # a Cyrillic i
]
NOT_DIRECT_SESSION_KEYS = [
    "agent:main:tg:GROUP:1",
    "agent:main:slack:CHANNEL:c1",
    "Agent:Main:Telegram:Group:42",
    "agent:main:tg: group :1",
    "agent:main:tg:\u200bgroup:1",
    "agent:main:telegram:supergroup:-100",
    "agent:main:matrix:room:!x",
    "agent:main:discord:group_dm:9",
    "agent:main:slack:mpim:9",
    "agent:main:telegram:group:-1001:topic:42",
    "agent:main:discord:channel:1:thread:2",
    "agent:main:tg:acct:group:1",  # an account segment before the kind
    "agent:main:tg:dm:7:group:1",  # says two things: not known to be direct
    "agent:main:cron:job-1",  # names no chat kind
    "agent:main",
    "agent:main:",
    "s-1234",  # not an agent key: says nothing of its chat, but it is a key
    "\u200b",
]
DIRECT_CALLERS = [
    {"chat_type": "direct"},
    {"chat_type": "DM"},
    {"chat_type": " Direct\u200b"},
    {"chat_type": "private"},
    {"chat_type": "im"},
    {"chat_type": "personal"},
    {"session_key": "agent:main:main"},
    {"session_key": "AGENT:main:MAIN"},
    {"session_key": "agent:main:main:thread:17"},
    {"session_key": "agent:main:dm:alice"},
    {"session_key": "agent:main:telegram:dm:7"},
    {"session_key": "agent:main:telegram:DM:7"},
    {"session_key": "agent:main:slack:acct2:direct:u1"},
    {"session_key": "agent:main:cli:direct:memory-search"},
    {"session_key": "s-1234", "chat_type": "dm"},  # an opaque key, and the chat type says
]


@pytest.mark.parametrize("chat_type", NOT_DIRECT_CHAT_TYPES)
def test_a_chat_type_not_known_to_be_direct_gets_no_long_term_memory(chat_type: str) -> None:
    assert "longterm" not in allowed_sources(Caller.from_params({"chat_type": chat_type}), ())
    assert "longterm" not in allowed_sources(Caller(chat_type=chat_type), ())
    assert allowed_sources(Caller(chat_type=chat_type), ()) == {"memory", "sessions"}


@pytest.mark.parametrize("key", NOT_DIRECT_SESSION_KEYS)
def test_a_session_key_not_known_to_be_direct_gets_no_long_term_memory(key: str) -> None:
    assert "longterm" not in allowed_sources(Caller.from_params({"session_key": key}), ())
    assert "longterm" not in allowed_sources(Caller(session_key=key), ())


@pytest.mark.parametrize("raw", DIRECT_CALLERS, ids=lambda raw: repr(raw))
def test_direct_chats_keep_long_term_memory(raw: dict[str, str]) -> None:
    assert allowed_sources(Caller.from_params(raw), ()) == ALL


def test_callers_that_say_nothing_keep_long_term_memory() -> None:
    """memctl on the user's own terminal: no chat type, no session key."""
    for raw in (None, {}, {"agent_id": "main"}, {"chat_type": "", "session_key": ""}):
        assert allowed_sources(Caller.from_params(raw), ()) == ALL


# Identity fields as hosts spell their keys; none of these callers is known to be direct.
NOT_DIRECT_KEY_SPELLINGS = [
    {"chatType": "group"},
    {"ChatType": "channel"},
    {"chat-type": "supergroup"},
    {"Chat Type": "group"},
    {"CHAT_TYPE": "group"},
    {"ｃｈａｔＴｙｐｅ": "group"},  # fullwidth
    {"sessionKey": "agent:main:tg:group:1"},
    {"session-key": "agent:main:slack:channel:c1"},
    {"SessionKey": "s-1234"},
    {"channel": "discord"},  # a chat on a channel, of a kind not said
    {"Channel": "telegram", "agentId": "main"},
]


@pytest.mark.parametrize("raw", NOT_DIRECT_KEY_SPELLINGS, ids=repr)
def test_identity_fields_in_any_spelling_are_read(raw: dict[str, str]) -> None:
    """OpenClaw writes camelCase: an identity memd did not recognise was no identity, and
    ``chatType: group`` kept long-term memory."""
    assert "longterm" not in allowed_sources(Caller.from_params(raw), ())


def test_two_spellings_of_a_field_must_agree() -> None:
    with pytest.raises(BadRequest, match="chat_type and chatType"):
        Caller.from_params({"chat_type": "dm", "chatType": "group"})
    same = Caller.from_params({"chat_type": "dm", "chatType": "dm", "agentId": "main"})
    assert (same.chat_type, same.agent_id) == ("direct", "main")


def test_conflicting_statements_of_the_chat_kind_are_not_direct() -> None:
    group_key = {"session_key": "agent:main:tg:group:1"}
    assert "longterm" not in allowed_sources(
        Caller.from_params({**group_key, "chat_type": "dm"}), ()
    )
    # The connection said group; one request's caller map says direct: still a group chat.
    hello = Caller.from_params(group_key)
    assert "longterm" not in allowed_sources(
        hello.merged(Caller.from_params({"chat_type": "dm"})), ()
    )
    direct = Caller.from_params({"session_key": "agent:main:tg:dm:1"})
    assert "longterm" not in allowed_sources(direct.merged(Caller(chat_type="GROUP")), ())


def test_scope_rules_match_the_normalised_chat_kind() -> None:
    rules = (ScopeRule(action="allow", chat_type="Group", channel="OPS", sources=("longterm",)),)
    for raw in (
        {"chat_type": "supergroup", "channel": "ops"},
        {"session_key": "agent:main:ops:GROUP:1"},
        {"session_key": "agent:main:Ops:\u200bgroup:1"},
    ):
        assert "longterm" in allowed_sources(Caller.from_params(raw), rules), raw
    deny = (ScopeRule(action="deny", key_prefix="agent:bot:", sources=("sessions",)),)
    assert "sessions" not in allowed_sources(Caller(session_key="AGENT:Bot:x:dm:1"), deny)
    assert Caller.from_params({"chat_type": "Private"}).chat_type == "direct"
    assert Caller.from_params({"session_key": "agent:m:x:SuperGroup:1"}).chat_type == "group"
