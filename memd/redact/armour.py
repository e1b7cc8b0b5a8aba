"""Private keys in every armour: PEM of any kind (RSA, EC, DSA, OPENSSH, ENCRYPTED, PGP blocks,
SSH2), PuTTY key files, JWK private members, .NET XML keys, minisign secret keys. They span lines
that start unindented, so they are found in the whole text before it is cut into blocks."""

from __future__ import annotations

import re
from collections.abc import Callable

from memd.redact.base import MARK

_LABEL = r"(?:[A-Z0-9]{1,20} ){0,4}PRIVATE KEY(?: BLOCK)?"
_PEM_BEGIN = re.compile(rf"-{{3,5}} ?BEGIN {_LABEL} ?-{{3,5}}")
_PEM_END = re.compile(rf"-{{3,5}} ?END {_LABEL} ?-{{3,5}}")
# Lines an unterminated block may hold: base64, or `Header: value` (Proc-Type, DEK-Info, Comment).
_PEM_LINE = re.compile(
    r"[ \t>#*;]*(?:[A-Za-z0-9+/=]{16,}|[A-Za-z-]{2,40}:[^\n]*|=[A-Za-z0-9+/]{4})[ \t]*"
)
# What a body line keeps before MARK: indentation, a quote's `>`, a comment's `#` or `*`.
_LEAD = re.compile(r"[ \t>#*;]*")


def _blank_lines(body: str) -> tuple[str, bool]:
    """Replace the content of every non-blank line of `body` by MARK, keeping its lead."""
    lines, changed = body.split("\n"), False
    for i, line in enumerate(lines):
        lead = _LEAD.match(line)
        cut = lead.end() if lead else 0
        core = line[cut:].strip()
        if core and core != MARK:
            lines[i] = line[:cut] + MARK + line[len(line.rstrip()) :]
            changed = True
    return "\n".join(lines), changed


def _pem(text: str) -> tuple[str, int]:
    out: list[str] = []
    pos = count = 0
    end: re.Match[str] | None = None
    searched = -1  # where the last search for an END started; none after it means none at all
    while (begin := _PEM_BEGIN.search(text, pos)) is not None:
        if searched < 0 or (end is not None and end.start() < begin.end()):
            end = _PEM_END.search(text, begin.end())
            searched = begin.end()
        if end is not None:
            body_end = end.start()
        else:  # unterminated: only the key-looking lines right after the BEGIN marker
            body_end = begin.end()
            while body_end < len(text):
                nl = text.find("\n", body_end + 1)
                nl = len(text) if nl < 0 else nl
                if not _PEM_LINE.fullmatch(text[body_end:nl].lstrip("\n")):
                    break
                body_end = nl
        body, changed = _blank_lines(text[begin.end() : body_end])
        out += [text[pos : begin.end()], body]
        count += changed
        pos = body_end
    out.append(text[pos:])
    return "".join(out), count


_PUTTY_LINES = re.compile(r"(?m)^Private-Lines:[ \t]*(?P<n>\d{1,4})[ \t]*$")
_PUTTY_MAC = re.compile(r"(?m)^(?P<p>Private-(?:MAC|Hash):[ \t]*)(?P<v>[0-9a-fA-F]{16,})")
_BASE64_LINE = re.compile(r"[ \t]*[A-Za-z0-9+/]+={0,2}[ \t]*")


def _putty(text: str) -> tuple[str, int]:
    """PuTTY key files: the `Private-Lines: N` lines that follow, and the MAC."""
    lines = text.split("\n")
    count = 0
    for i, line in enumerate(lines):
        m = _PUTTY_LINES.fullmatch(line)
        if m is None:
            continue
        for j in range(i + 1, min(i + 1 + int(m.group("n")), len(lines))):
            if not _BASE64_LINE.fullmatch(lines[j]):
                break
            lines[j] = MARK
        count += 1
    text, n = _PUTTY_MAC.subn(lambda m: m.group("p") + MARK, "\n".join(lines))
    return text, count + n


# JWK private members; only in text that also holds a `"kty"` nearby.
_JWK_MEMBER = re.compile(r'"(?:d|p|q|dp|dq|qi|k)"[ \t]*:[ \t]*"(?P<v>[A-Za-z0-9_-]{16,})"')
# .NET `<RSAKeyValue>`: the private parameters.
_XML_MEMBER = re.compile(
    r"<(?P<tag>D|P|Q|DP|DQ|InverseQ)>(?P<v>[A-Za-z0-9+/]{16,}={0,2})</(?P=tag)>"
)
_WINDOW = 4096


def _members(pattern: re.Pattern[str], near: str) -> Callable[[str], tuple[str, int]]:
    def redact(text: str) -> tuple[str, int]:
        count = 0

        def replace(m: re.Match[str]) -> str:
            nonlocal count
            lower = text[max(0, m.start() - _WINDOW) : m.end() + _WINDOW].lower()
            if near not in lower:
                return m.group(0)
            count += 1
            whole = m.group(0)
            return whole[: m.start("v") - m.start()] + MARK + whole[m.end("v") - m.start() :]

        return pattern.sub(replace, text), count

    return redact


# minisign and signify secret keys: a comment line that says so, then the base64 key.
_SIGN_KEY = re.compile(
    r"(?im)^(?P<p>untrusted comment:[^\n]*secret key[^\n]*\n)(?P<v>[A-Za-z0-9+/]{40,}={0,2})[ \t]*$"
)


def _signing_key(text: str) -> tuple[str, int]:
    return _SIGN_KEY.subn(lambda m: m.group("p") + MARK, text)


# (needles, rule): each runs on the whole text when it holds one of its needles (lower-cased).
RULES: list[tuple[tuple[str, ...], Callable[[str], tuple[str, int]]]] = [
    (("private key",), _pem),
    (("private-lines", "private-mac", "private-hash"), _putty),
    (('"kty"',), _members(_JWK_MEMBER, '"kty"')),
    (("<rsakeyvalue",), _members(_XML_MEMBER, "<rsakeyvalue")),
    (("untrusted comment",), _signing_key),
]


def redact_armour(text: str) -> tuple[str, int]:
    """Replace the private parts of every private key in `text`, keeping its armour lines."""
    lower = text.lower()
    total = 0
    for needles, rule in RULES:
        if any(n in lower for n in needles):
            text, n = rule(text)
            total += n
    return text, total
