"""What a secret value looks like, and the values (code, placeholders, paths) that are not secrets."""

from __future__ import annotations

import binascii
import math
import re

from memd.redact.base import MARK


def entropy(s: str) -> float:
    """Shannon entropy of `s` in bits per character."""
    counts: dict[str, int] = {}
    for ch in s:
        counts[ch] = counts.get(ch, 0) + 1
    return -sum(c / len(s) * math.log2(c / len(s)) for c in counts.values())


def classes(s: str) -> int:
    """Character classes present: lower, upper, digit, symbol (`-_.` are not symbols)."""
    checks = (str.islower, str.isupper, str.isdigit, lambda c: not c.isalnum() and c not in "-_.")
    return sum(any(check(c) for c in s) for check in checks)


_HEX = re.compile(r"[0-9a-fA-F]{32,}")


def high_entropy(s: str) -> bool:
    """Does `s` look random: >= 20 chars, two character classes, >= 3.5 bits per char? Hex of
    32 or more digits and letters is random too (its 16 symbols cap entropy near 3.5-4 bits)."""
    if _HEX.fullmatch(s):
        return any(c.isdigit() for c in s) and any(c.isalpha() for c in s)
    return len(s) >= 20 and classes(s) >= 2 and entropy(s) >= 3.5


_SEGMENT = re.compile(r"[A-Za-z0-9]+")
_PLAIN = re.compile(r"[a-z]+|[A-Z]+|[A-Z][a-z]+|[0-9]+")
# A name made of words: camelCase, snake_case, dotted or dashed humps, digits only at a hump's
# end (`includeDefaultMemory`, `memory_index_meta_v1`); random text breaks the pattern quickly.
_WORDS_NAME = re.compile(r"[a-z]+[0-9]*(?:[._-][a-z]+[0-9]*|[._-]?[A-Z][a-z]+[0-9]*)*")


def random_token(s: str) -> bool:
    """Is `s` random, not a name made of words or an identifier built of words and numbers
    (`includeDefaultMemory`, `arn:aws:...:secret:db`)?"""
    if not high_entropy(s) or _WORDS_NAME.fullmatch(s):
        return False
    segments = _SEGMENT.findall(s)
    plain = sum(len(x) for x in segments if _PLAIN.fullmatch(x))
    return plain * 2 < sum(len(x) for x in segments)


def password_like(s: str) -> bool:
    """Does `s` look like a password rather than a word: >= 8 chars with a digit or a symbol?"""
    return len(s) >= 8 and any(not c.isalpha() and c not in "-_." for c in s)


def basic_credentials(token: str) -> bool:
    """Is `token` base64 of printable `user:password` text (the user may be empty)?"""
    try:
        text = binascii.a2b_base64(token.encode(), strict_mode=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return False
    user, sep, password = text.partition(":")
    return bool(sep and password) and text.isprintable() and " " not in user


# Words that stand where a value would but say nothing secret: `password: required`, `token: str`.
NOT_SECRET = frozenset(
    {
        *("none", "null", "nil", "true", "false", "undefined", "yes", "no", "on", "off"),
        *("required", "optional", "str", "string", "bytes", "int", "bool", "any", "secret"),
        *("password", "token", "hidden", "redacted", "masked", "empty", "unset"),
    }
)
# Unquoted values that are code: `$TOKEN`, `${VAR}`, `%APPDATA%`, `***`, `xxxx`, `...`, `|-`.
_CODE_VALUE = re.compile(
    r"\*+|[xX]+|\.+|[|>][-+]?[0-9]?"
    r"|\$(?:\{[^}\s]*\}|[A-Za-z_]\w*|\d)\S*|%[A-Za-z_]\w*%|%\(\w+\)[sdr]"
)
# Names in code: `api_key_env`, `password_field` (lower-case words, digits at a word's end; so
# `qB_o_87fI1yC8SC` is a password), `self.secret`, `settings.SECRET_KEY` (unless random).
_SNAKE = re.compile(r"[a-z]+[0-9]*(?:_(?:[a-z]+[0-9]*|[0-9]+))+")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
# `/run/secrets/db`, `~/.ssh/id_ed25519`, `./keys/dev.pem`: paths, unless a segment is random.
_PATH = re.compile(r"(?:~|\.{1,2})?/[\w.@~-]*(?:/[\w.@~-]*)*")
# A camelCase name or a CONSTANT right before `,`, `)`, `}` or `;`: `{ email, password:
# hashedPassword }`, `{"OPENAI_API_KEY": KEY, ...}`.
_CAMEL = re.compile(r"[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+|[A-Z]+(?:_[A-Z]+)*")
_STRING_PREFIXES = frozenset({"f", "b", "r", "u", "rb", "br", "fr", "rf"})
PLACEHOLDER_STARTS = ("${", "{{", "<", "%(", "$(", "#{", "[[")
# A URL with no user in it is an address; its parameters are judged by their own names.
_PLAIN_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s@]*")


def is_path(value: str) -> bool:
    """Is `value` a file path rather than a key that happens to start with `/`?"""
    return bool(_PATH.fullmatch(value)) and not any(
        len(part) >= 20 and high_entropy(part) for part in value.split("/")
    )


def is_code(value: str) -> bool:
    """Is this unquoted value code or a path: `self.secret`, `$TOKEN`, `***`, `/run/secrets/db`?"""
    if _CODE_VALUE.fullmatch(value) or is_path(value):
        return True
    if _SNAKE.fullmatch(value):
        return True
    return bool(_DOTTED.fullmatch(value)) and not random_token(value)


def not_a_secret(inner: str, *, quoted: bool, key: str = "", after: str = "") -> bool:
    """Is this value of a secret-named key code, a placeholder or a word that holds no secret?

    Args:
        inner: the value without its quotes.
        quoted: whether the value was quoted (quoted text is never read as code).
        key: the name it was assigned to (`password = password` passes a variable on).
        after: the text right after the value on its line.
    """
    core = inner.strip()
    if not core or MARK in core or core.lower() in NOT_SECRET:
        return True
    if (core + after).startswith(PLACEHOLDER_STARTS):  # `${VAR}`: the value stopped at `{`
        return True
    if _PLAIN_URL.fullmatch(core):
        return True
    if quoted:
        return bool(re.fullmatch(r"\$\w+", core))  # "$TOKEN": the shell expands it
    if after[:1] in ("(", "[") or after[:1] in ('"', "'") and core.lower() in _STRING_PREFIXES:
        return True  # a call, a subscript, a string's prefix: `get_password()`, `f"{x}"`
    if is_code(core) or core.lower() == key.lower():
        return True
    return bool(_CAMEL.fullmatch(core)) and after.lstrip(" \t")[:1] in (",", ")", "}", ";")
