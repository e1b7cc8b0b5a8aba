"""Who is asking (caller identity) and which sources they may search (scope rules)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memd.config import ScopeRule
from memd_client.errors import BadRequest

__all__ = [
    "ANONYMOUS",
    "CALLER_FIELDS",
    "SHARED_CHATS",
    "SOURCE_CLASSES",
    "Caller",
    "default_decision",
    "allowed_sources",
    "is_longterm",
]

SOURCE_CLASSES = ("longterm", "memory", "sessions")
_FIELDS = ("agent_id", "session_key", "chat_type", "channel")
CALLER_FIELDS = frozenset(_FIELDS)


@dataclass(frozen=True)
class Caller:
    """What a connection says about itself; every field may be empty (an anonymous caller)."""

    agent_id: str = ""
    session_key: str = ""
    chat_type: str = ""
    channel: str = ""

    @classmethod
    def from_params(cls, raw: Mapping[str, Any] | None) -> Caller:
        """Read identity fields; a session key ``agent:<id>:<channel>:<chat type>:…`` fills
        the ones not given (``dm`` means a direct chat)."""
        if not raw:
            return cls()
        values: dict[str, str] = {}
        for name in _FIELDS:
            value = raw.get(name)
            if value is None:
                continue
            if not isinstance(value, str) or len(value) > 512:
                raise BadRequest(f"{name} must be a string of at most 512 characters")
            values[name] = value
        parts = values.get("session_key", "").split(":")
        if len(parts) >= 2 and parts[0] == "agent":
            values.setdefault("agent_id", parts[1])
            if len(parts) >= 3:
                values.setdefault("channel", parts[2])
            if len(parts) >= 4:
                values.setdefault("chat_type", "direct" if parts[3] == "dm" else parts[3])
        return cls(**values)

    def merged(self, override: Caller) -> Caller:
        """This identity with the fields ``override`` sets replacing ours."""
        return Caller(**{f: getattr(override, f) or getattr(self, f) for f in _FIELDS})

    def to_dict(self) -> dict[str, str]:
        return {f: getattr(self, f) for f in _FIELDS}


ANONYMOUS = Caller()  # a caller that said nothing about itself


def _matches(rule: ScopeRule, caller: Caller) -> bool:
    if rule.chat_type and rule.chat_type != caller.chat_type:
        return False
    if rule.channel and rule.channel != caller.channel:
        return False
    return not (rule.key_prefix and not caller.session_key.startswith(rule.key_prefix))


# Chats that other people read. Long-term memory (MEMORY.md) holds what the user chose to keep
# about themselves; as in OpenClaw, it is not served there unless a scope rule allows it.
SHARED_CHATS = frozenset({"group", "channel"})


def default_decision(source: str, caller: Caller) -> str:
    """What applies to ``source`` when no scope rule matches: allow, except long-term memory in
    a group or channel chat. Direct chats and callers that give no chat type are allowed."""
    if source == "longterm" and caller.chat_type in SHARED_CHATS:
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
