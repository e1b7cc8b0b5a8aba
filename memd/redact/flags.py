"""Passwords given on a command line: long flags whose name says secret (`--token X`, `-storepass X`)
and the short flags of the clients that take one (`mysql -pX`, `redis-cli -a X`, `curl -u u:X`)."""

from __future__ import annotations

import re

from memd.redact.base import MARK, Rule, marked, regex_rule
from memd.redact.names import FRAGMENT_RE, Tier, accepts, tier

_WORD = r"'[^'\n]{1,512}'|\"[^\"\n]{1,512}\"|[^\s'\"|;&<>()-][^\s|;&<>()]*"

# `--token VALUE`, `-storepass VALUE`: the `--name=VALUE` spelling is an assignment.
_LONG_FLAG = re.compile(
    # Starts with the literal `-` (found fast), then checks what stands before it.
    rf"(?P<flag>-(?<![A-Za-z0-9_-]-)-?[A-Za-z0-9_.-]{{0,40}}?{FRAGMENT_RE}[A-Za-z0-9_.-]{{0,24}})"
    rf"[ \t]+(?P<v>{_WORD})"
)


def _long_flag(m: re.Match[str]) -> str | None:
    flag, value = m.group("flag"), m.group("v")
    quoted = value[0] in "'\""
    inner = value[1:-1] if quoted else value
    if flag.startswith("--no-") or marked(m, "v") or (not quoted and "=" in inner):
        return None  # `--no-password db`; `--secret id=x,src=y` names a secret, is none
    level = tier(flag)
    if level < Tier.STRONG or not accepts(level, inner, quoted=quoted, key=flag):
        return None
    return m.group(0)[: m.start("v") - m.start()] + _masked(value)


# How each client takes a password, as the regex after the command: `(?P<v>...)` is the secret.
_ATTACHED = r"-p(?P<v>'[^'\n]{1,512}'|\"[^\"\n]{1,512}\"|[^\s'\"]+)"  # mysql -pX, 7z -pX
_NEXT = r"[ \t]+(?P<v>" + _WORD + ")"


def _flag(flag: str) -> str:
    return rf"{flag}(?:{_NEXT}|(?P<a>'[^'\n]{{1,512}}'|\"[^\"\n]{{1,512}}\"|[^\s'\"-][^\s]*))"


# (command, how it takes a password, whether that comes right after the command). In the flags'
# regex, `v` or `a` is the password. A client's own port flag (`redis-cli -p`, `mysql -P`,
# `docker run -p`) is never in it.
_CLIENTS: list[tuple[str, str, bool]] = [
    (r"mysql\w*|mariadb(?:-\w+)?|7z[az]?", _ATTACHED, False),
    (r"mongo\w*|cqlsh|sshpass|rdesktop|psexec(?:64)?", _flag("-p"), False),
    (
        r"(?:docker|podman|nerdctl|buildah|skopeo|helm|oras|crane)[ \t]+(?:\S+[ \t]+)?login",
        _flag("-p"),
        False,
    ),
    (r"redis-cli|keydb-cli|valkey-cli", _flag("-a"), False),
    (r"sqlcmd|bcp|osql|isql|zip|unzip|zipcloak", _flag("-P"), False),
    (r"ldap\w+", _flag("-w"), False),
    (r"smbclient|rpcclient|smbmap|smbget", r"-U[ \t]+[^\s%]+%(?P<v>[^\s]+)", False),
    (r"curl", r"(?:-u|--user|-U|--proxy-user)[ \t=]+['\"]?[^\s:'\"]*:(?P<v>[^\s'\"]+)", False),
    (
        r"openssl",
        r"(?:-pass\w*[ \t]+pass:(?P<v>[^\s'\"]+)|-k" + _NEXT.replace("<v>", "<a>") + ")",
        False,
    ),
    (r"xfreerdp|wlfreerdp", r"/p:(?P<v>[^\s]+)", False),
    (
        r"htpasswd",
        r"-[a-zA-Z]*b[a-zA-Z]*(?:[ \t]+-[a-zA-Z]+)*[ \t]+\S+[ \t]+\S+[ \t]+(?P<v>" + _WORD + ")",
        False,
    ),
    # Oracle: `sqlplus user/password@db`, the first argument after any flags.
    (
        r"sqlplus|sqlldr|expdp|impdp|rman|dgmgrl",
        r"[ \t]+(?:-\w+[ \t]+)*(?:userid=)?[A-Za-z_][\w$#]*/(?P<v>[^\s@/'\"]+)(?=[@\s]|$)",
        True,
    ),
]
_CLIENT = re.compile(
    r"(?<![A-Za-z0-9_./-])(?:"
    + "|".join(f"(?P<c{i}>{cmd})" for i, (cmd, _, _) in enumerate(_CLIENTS))
    + r")(?:\.exe)?(?=[ \t])"
)
_CLIENT_FLAGS = [
    (re.compile(flags if anchored else r"(?<=\s)" + flags), anchored)
    for _, flags, anchored in _CLIENTS
]
_COMMAND_END = re.compile(r"(?<!\\)\n|&&|\|\||;|(?<=[ \t])\|(?=[ \t])")
# Where a client's password can be: one of its flags, `/p:`, or `user/password`. Only the
# logical lines holding one are searched for a client, so prose costs one scan for `-` and `/`.
_CANDIDATE = re.compile(r"-[pPawUukb]|/")


def _logical_line(text: str, pos: int) -> tuple[int, int]:
    """Span of the line holding `pos`, with the lines a trailing backslash joins to it."""
    start = text.rfind("\n", 0, pos) + 1
    while start > 1 and text[start - 2] == "\\":
        start = text.rfind("\n", 0, start - 1) + 1
    end = text.find("\n", pos)
    while end > 0 and text[end - 1] == "\\":
        end = text.find("\n", end + 1)
    return start, len(text) if end < 0 else end


def _masked(value: str) -> str:
    quoted = value[:1] in ("'", '"') and len(value) > 1 and value[-1] == value[0]
    return value[0] + MARK + value[0] if quoted else MARK


def redact_clients(text: str) -> tuple[str, int]:
    """Redact the password each known client was given on its command line."""
    spans: set[tuple[int, int]] = set()
    searched = 0
    for candidate in _CANDIDATE.finditer(text):
        if candidate.start() < searched:
            continue
        line_start, searched = _logical_line(text, candidate.start())
        for m in _CLIENT.finditer(text, line_start, searched):
            pattern, anchored = _CLIENT_FLAGS[int((m.lastgroup or "c0")[1:])]
            end = _COMMAND_END.search(text, m.end(), searched)
            stop = end.start() if end else searched
            found = (
                [pattern.match(text, m.end(), stop)]
                if anchored
                else pattern.finditer(text, m.end(), stop)
            )
            for f in found:
                if f is None:
                    continue
                group = "v" if f.groupdict().get("v") is not None else "a"
                value = f.group(group)
                quoted = value[0] in "'\"" and len(value) > 1 and value[-1] == value[0]
                inner = value[1:-1] if quoted else value
                spaced = text[f.start(group) - 1] in " \t"  # not `-pX`, `/p:X`, `u:X`
                if (quoted or not spaced or not inner.startswith("-")) and accepts(
                    Tier.PASSWORD, inner, quoted=quoted
                ):
                    spans.add(f.span(group))
    out: list[str] = []
    pos = count = 0
    for start, end_ in sorted(spans):
        if start >= pos:
            out += [text[pos:start], _masked(text[start:end_])]
            pos, count = end_, count + 1
    out.append(text[pos:])
    return "".join(out), count


# Literal parts of the client names above, one of which any client's command line holds.
COMMANDS = (
    *("sql", "maria", "7z", "mongo", "cqlsh", "sshpass", "rdesktop", "psexec", "login", "-cli"),
    *("bcp", "zip", "ldap", "smb", "rpcclient", "curl", "openssl", "freerdp", "htpasswd", "pdp"),
    *("rman", "dgmgrl"),
)


# Rules for text whose names say secret.
RULES: list[Rule] = [regex_rule(_LONG_FLAG, _long_flag)]
