"""Who is asking (caller identity) and which sources they may search (scope rules)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from memd.config import ScopeRule
from memd_client.errors import BadRequest

__all__ = [
    "ANONYMOUS",
    "CALLER_FIELDS",
    "DIRECT_CHATS",
    "SHARED_CHATS",
    "SOURCE_CLASSES",
    "Caller",
    "chat_word",
    "default_decision",
    "allowed_sources",
    "caller_field",
    "is_longterm",
]

SOURCE_CLASSES = ("longterm", "memory", "sessions")
_FIELDS = ("agent_id", "session_key", "chat_type", "channel")
CALLER_FIELDS = frozenset(_FIELDS)
# A field in any spelling a host may send: chatType, ChatType, chat-type, "chat type" (OpenClaw
# itself writes camelCase). An identity memd did not recognise was no identity at all, and a
# group chat that said `chatType: group` got long-term memory.
_NOT_IN_A_NAME = re.compile(r"[\s_\-.]+")
_BY_SPELLING = {_NOT_IN_A_NAME.sub("", f): f for f in _FIELDS}


def caller_field(key: object) -> str | None:
    """The identity field ``key`` spells (``chatType`` is ``chat_type``), or None."""
    if not isinstance(key, str):
        return None
    return _BY_SPELLING.get(_NOT_IN_A_NAME.sub("", unicodedata.normalize("NFKC", key)).casefold())


# How hosts name a one-to-one chat with the user (OpenClaw's "direct" and "dm", Telegram's
# "private", Slack's "im", Teams' "personal"), compared after chat_word(). Any other chat kind
# is not direct: long-term memory is private by default, so a spelling memd does not know is
# denied, never allowed.
DIRECT_CHATS = frozenset({"direct", "dm", "private", "im", "personal", "p2p", "one_on_one"})
# Spellings of chats other people read, told apart only so that a scope rule for "group" or
# "channel" matches them too (Telegram's "supergroup", Slack's "mpim", Discord's "group_dm").
_GROUP_CHATS = frozenset({"group", "supergroup", "mpim", "group_dm", "groupdm", "groupchat"})
_CHANNEL_CHATS = frozenset({"channel", "room", "space", "guild", "forum", "broadcast"})
SHARED_CHATS = _GROUP_CHATS | _CHANNEL_CHATS
# Suffixes of a session key that name a thread or topic inside a chat, not a kind of chat.
_SUBCHATS = frozenset({"thread", "topic"})
_SEPARATORS = re.compile(r"[\s_\-]+")


def _clean(text: str) -> str:
    """``text`` in NFKC without invisible characters (format and control characters: zero
    width spaces and joiners, bidirectional marks, byte order marks) or surrounding spaces."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) not in ("Cf", "Cc"))
    return text.strip()


def chat_word(text: str) -> str:
    """A chat kind as memd compares it: cleaned, case folded, runs of spaces, hyphens and
    underscores as one underscore; a direct-chat spelling is "direct", a group's "group", a
    channel's "channel"."""
    word = _SEPARATORS.sub("_", _clean(text).casefold()).strip("_")
    if word in DIRECT_CHATS:
        return "direct"
    if word in _GROUP_CHATS:
        return "group"
    if word in _CHANNEL_CHATS:
        return "channel"
    return word


def _key_parts(key: str) -> list[str] | None:
    """The segments after ``agent:<id>`` of an OpenClaw-style session key, else None."""
    parts = key.split(":")
    if len(parts) < 2 or _clean(parts[0]).casefold() != "agent":
        return None
    return parts[2:]


def _key_kind(key: str) -> str:
    """The chat kind a session key names: "direct" for the agent's main session
    (``agent:<id>:main``) or a key with a direct-chat segment and no other kind; a group or
    channel when it has such a segment; "" when it names no kind (not an agent key, or one
    like ``agent:<id>:cron:<job>``)."""
    rest = _key_parts(key)
    if not rest:
        return ""
    words = [chat_word(p) for p in rest]
    while len(words) >= 3 and words[-2] in _SUBCHATS:
        words = words[:-2]
    if words == ["main"]:
        return "direct"
    kinds = {w for w in words if w in ("direct", "group", "channel")}
    if kinds == {"direct"}:
        return "direct"
    return "group" if "group" in kinds else "channel" if kinds else ""


@dataclass(frozen=True)
class Caller:
    """What a connection says about itself; every field may be empty (an anonymous caller).

    Fields are normalised once, here: NFKC, no invisible characters, no surrounding spaces,
    and the chat type as :func:`chat_word` gives it.
    """

    agent_id: str = ""
    session_key: str = ""
    chat_type: str = ""
    channel: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            raw = getattr(self, f.name)
            value = _clean(raw)
            if f.name == "chat_type":
                # A chat type of only invisible characters or spaces said something: not
                # nothing (which would keep long-term memory), but a kind memd does not know.
                value = chat_word(raw) or ("unknown" if raw else "")
            elif f.name == "session_key" and not value:
                value = raw  # likewise: a key of invisible characters is a key, not none
            object.__setattr__(self, f.name, value)

    @classmethod
    def from_params(cls, raw: Mapping[str, Any] | None) -> Caller:
        """Read identity fields; a session key ``agent:<id>:<channel>:<chat type>:…`` fills
        the ones not given (``dm`` means a direct chat, as ``agent:<id>:main`` does)."""
        if not raw:
            return cls()
        values: dict[str, str] = {}
        spelt: dict[str, str] = {}
        for key, value in raw.items():
            name = caller_field(key)
            if name is None or value is None:
                continue
            if not isinstance(value, str) or len(value) > 512:
                raise BadRequest(f"{key} must be a string of at most 512 characters")
            if name in values and values[name] != value:
                raise BadRequest(f"{spelt[name]} and {key} name the same field with two values")
            values[name], spelt[name] = value, key
        key = values.get("session_key", "")
        parts = key.split(":")
        rest = _key_parts(key)
        if rest is not None:
            values.setdefault("agent_id", _clean(parts[1]))
            words = [chat_word(p) for p in rest]
            at = next((i for i, w in enumerate(words) if w in ("direct", "group", "channel")), 0)
            if at >= 1:  # agent:<id>:<channel>:[<account>:]<chat type>:…
                values.setdefault("channel", rest[0])
            kind = _key_kind(key)
            if kind:
                values.setdefault("chat_type", kind)
        return cls(**values)

    def merged(self, override: Caller) -> Caller:
        """This identity with the fields ``override`` sets replacing ours."""
        return Caller(**{f: getattr(override, f) or getattr(self, f) for f in _FIELDS})

    def to_dict(self) -> dict[str, str]:
        return {f: getattr(self, f) for f in _FIELDS}

    @property
    def says_nothing(self) -> bool:
        """No chat type, session key or channel: memctl on the user's own terminal, a script.
        A caller that names its channel speaks from a chat, of a kind it does not say."""
        return not self.chat_type and not self.session_key and not self.channel

    @property
    def kind(self) -> str:
        """The chat kind, from the chat type or else the session key ("" when neither says)."""
        return self.chat_type or _key_kind(self.session_key)

    @property
    def direct(self) -> bool:
        """Whether this is known to be a direct chat with the user: every statement of the chat
        kind (the chat type, the session key) says direct, and at least one does."""
        said = [k for k in (self.chat_type, _key_kind(self.session_key)) if k]
        return bool(said) and all(k == "direct" for k in said)


ANONYMOUS = Caller()  # a caller that said nothing about itself


def _fold(text: str) -> str:
    return _clean(text).casefold()


def _matches(rule: ScopeRule, caller: Caller) -> bool:
    if rule.chat_type and chat_word(rule.chat_type) != caller.kind:
        return False
    if rule.channel and _fold(rule.channel) != _fold(caller.channel):
        return False
    return not (
        rule.key_prefix and not _fold(caller.session_key).startswith(_fold(rule.key_prefix))
    )


def default_decision(source: str, caller: Caller) -> str:
    """What applies to ``source`` when no scope rule matches: allow, except long-term memory
    for a caller not known to be in a direct chat. Long-term memory (MEMORY.md) holds what the
    user chose to keep about themselves; as in OpenClaw, it is not served in chats other people
    read. A caller that says nothing of its chat (the user's own terminal) keeps it."""
    if source == "longterm" and not (caller.says_nothing or caller.direct):
        return "deny"
    return "allow"


def allowed_sources(caller: Caller, rules: Sequence[ScopeRule]) -> set[str]:
    """The source classes ``caller`` may search: for each class, the first rule that matches the
    caller and names the class decides; with no such rule, :func:`default_decision`."""
    allowed = set()
    for source in SOURCE_CLASSES:
        decision = default_decision(source, caller)
        for rule in rules:
            if source in rule.sources and _matches(rule, caller):
                decision = rule.action
                break
        if decision == "allow":
            allowed.add(source)
    return allowed


def is_longterm(path: str) -> bool:
    """MEMORY.md and its legacy spelling (any case): the curated long-term memory; and DREAMS.md,
    the dream diary, which quotes what was promoted into it."""
    return path.lower() in ("memory.md", "dreams.md")
