"""Secret redaction for text before it is indexed: API keys, tokens, passwords, private keys.

Every replacement keeps line structure (no newline is ever added or removed) and is idempotent.
"""

from __future__ import annotations

import binascii
import hashlib
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["MARK", "redact", "redact_with_count"]

MARK = "[REDACTED]"

# Choices (documented here, tested in tests/test_redact.py):
# - Typed keys keep their provider prefix (`sk-[REDACTED]`, `ghp_[REDACTED]`, `eyJ[REDACTED]` for
#   JWTs); assignments and headers keep the key/scheme and quotes and lose only the value.
# - A PEM private key block keeps its BEGIN/END lines; each non-blank body line becomes MARK. A BEGIN
#   line without an END only swallows the base64/header lines that directly follow it.
# - Loose prefixes (`sk-`, `hf_`, `pa-`) and key-like contexts need a high-entropy value: length
#   >= 20, Shannon entropy >= 3.5 bits/char, and two character classes (a hyphenated slug is not).
# - Prose "is" statements ("my password is strong") are redacted only when the value looks like a
#   password: >= 8 chars with a digit or a symbol ("my password is hunter2!" is redacted).
# - `key: value` with an unquoted value is redacted only when the value ends the line or looks like
#   a password, so Markdown such as "Token: the unit a model reads" stays intact.
# - Code is left alone: `token_count = 5`, `password_field = ...`, `password = get_password()`,
#   `secret = self.secret`, `pwd = /home/me` (paths), `None`/`true`/type names, `${VAR}` placeholders.
# - Base64 that is not in a key-like context (e.g. a `data:image/png;base64,...` URI) is kept.

_B = r"(?<![A-Za-z0-9_-])"  # start of a token: never inside a longer word or base64 run
_E = r"(?![A-Za-z0-9_-])"

_TYPED: list[tuple[str, bool]] = [  # (pattern with groups p=kept prefix, v=secret; needs entropy)
    (r"(?P<p>sk-ant-)(?P<v>[A-Za-z0-9_-]{20,})", False),
    (r"(?P<p>sk-proj-)(?P<v>[A-Za-z0-9_-]{20,})", False),
    (r"(?P<p>sk-)(?P<v>[A-Za-z0-9_-]{20,})", True),
    (r"(?P<p>(?:sk|rk|pk)_(?:live|test)_)(?P<v>[A-Za-z0-9]{10,})", False),
    (r"(?P<p>AIza)(?P<v>[A-Za-z0-9_-]{35})", False),
    (r"(?P<p>gh[pousr]_)(?P<v>[A-Za-z0-9]{30,})", False),
    (r"(?P<p>github_pat_)(?P<v>[A-Za-z0-9_]{22,})", False),
    (r"(?P<p>glpat-)(?P<v>[A-Za-z0-9_-]{20,})", False),
    (r"(?P<p>xox[abprs]-)(?P<v>[A-Za-z0-9-]{10,})", False),
    (r"(?P<p>A[KS]IA)(?P<v>[A-Z0-9]{16})", False),
    (r"(?P<p>hf_)(?P<v>[A-Za-z0-9]{30,})", True),
    (r"(?P<p>pa-)(?P<v>[A-Za-z0-9_-]{20,})", True),
    (r"(?P<p>eyJ)(?P<v>[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*)", False),
    (r"(?P<p>npm_)(?P<v>[A-Za-z0-9]{36})", False),
    (r"(?P<p>pypi-)(?P<v>AgE[A-Za-z0-9_-]{50,})", False),
    (r"(?P<p>SG\.)(?P<v>[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43})", False),
    (r"(?P<p>\d{8,10}:)(?P<v>AA[A-Za-z0-9_-]{33})", False),  # Telegram bot token
    (r"(?P<p>shp(?:at|ca|pa|ss)_)(?P<v>[a-fA-F0-9]{32})", False),  # Shopify
    (r"(?P<p>dop_v1_)(?P<v>[a-f0-9]{64})", False),  # DigitalOcean
    (r"(?P<p>ya29\.)(?P<v>[A-Za-z0-9_-]{20,})", False),  # Google OAuth access token
    (r"(?P<p>SK)(?P<v>[0-9a-f]{32})", False),  # Twilio API key
    (r"(?P<p>key-)(?P<v>[0-9a-f]{32})", False),  # Mailgun
    (
        r"(?P<p>https://hooks\.slack\.com/(?:services|workflows|triggers)/)(?P<v>[A-Za-z0-9/_-]{20,})",
        False,
    ),
    (
        r"(?P<p>https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d{5,30}/)"
        r"(?P<v>[A-Za-z0-9_-]{30,})",
        False,
    ),
]
_TYPED_RE = [(re.compile(_B + pat + _E), loose) for pat, loose in _TYPED]

_URL_CRED = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<p>[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s:/@\[\]]{0,256}:)"
    r"(?P<v>[^\s/]{1,256})@"  # greedy: a password may hold '@'; the host follows the last one
)
_BEARER = re.compile(r"(?<![A-Za-z0-9_])(?P<p>(?i:bearer)[ \t]{1,4})(?P<v>[A-Za-z0-9._~+/=-]{16,})")
_BASIC = re.compile(
    r"(?<![A-Za-z0-9_])(?P<p>(?i:basic)[ \t]{1,4})(?P<v>[A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])"
)

_ASSIGN = re.compile(
    r"(?<![A-Za-z0-9_])(?P<key>(?i:[A-Za-z0-9_.-]{0,48}?(?:pass(?:word|phrase|code)?|passwd|pwd|pw|secret|token|key)))"
    r"(?P<mid>(?:[\"'`]|\*\*)?[ \t]{0,4}(?P<op>:=|=>|[:=](?!=))[ \t]{0,4})"
    r"(?P<val>\"[^\"\n]{1,1024}\"|'[^'\n]{1,1024}'|[^\s\"'`,;&()\[\]{}<>]+)"
)
_PASSWORD_KEY = re.compile(
    r"(?:password|passwd|passphrase|passcode|pwd)$|(?:^|[_.-])(?:pass|pw)$", re.I
)
# A key alone on its line, its value on the next, indented (YAML), or a block scalar.
_NEXT_LINE = re.compile(
    r"(?im)^(?P<head>[ \t]*-?[ \t]*[\"']?[A-Za-z0-9_.-]{0,48}?"
    r"(?:pass(?:word|phrase|code)?|passwd|pwd|secret|token|(?:api|access|private|auth|client)[_.-]?key)"
    r"[\"']?[ \t]*:[ \t]*(?:[|>][-+]?[ \t]*)?\n[ \t]+)(?P<val>[^\s#][^\n]*)"
)
_STRONG_KEY = re.compile(r"(?:secret|token|(?:api|access|private|auth|client)[_.-]?key)$", re.I)
_WEAK_KEY = re.compile(r"key$", re.I)  # `key`, `sort_key`: only a high-entropy value
_NOT_SECRET = {
    *("none", "null", "nil", "true", "false", "undefined", "yes", "no", "on", "off", "required"),
    *("str", "string", "bytes", "int", "bool", "any", "optional", "secret", "password", "token"),
}
_CODE_VALUE = re.compile(
    r"(?:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+|[a-z]\w*_\w*|[$%]\S*|\*+|x+|\.+|(?:~|\.{1,2})?/\S*)"
)

_CONTEXT = re.compile(
    r"(?<![A-Za-z0-9_])(?P<word>(?i:pass(?:word|phrase)|passwd|pwd|secret|token|key))s?"
    r"(?P<gap>(?:[ \t]{1,3}(?i:is|was)(?![A-Za-z]))?[ \t]{0,3}(?:[:=][ \t]{0,3})?[\"'`]?)"
    r"(?P<val>[A-Za-z0-9+/_.=~!@#$%^&*-]{8,})"
)

_PEM_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]{1,20} ){0,3}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END (?:[A-Z0-9]{1,20} ){0,3}PRIVATE KEY(?: BLOCK)?-----")
_PEM_LINE = re.compile(r"[ \t]*(?:[A-Za-z0-9+/=]{16,}|[A-Za-z-]{2,40}:[^\n]*)[ \t]*")


def _entropy(s: str) -> float:
    counts: dict[str, int] = {}
    for ch in s:
        counts[ch] = counts.get(ch, 0) + 1
    return -sum(c / len(s) * math.log2(c / len(s)) for c in counts.values())


def _classes(s: str) -> int:
    """Character classes present: lower, upper, digit, symbol (`-_.` are not symbols)."""
    checks = (str.islower, str.isupper, str.isdigit, lambda c: not c.isalnum() and c not in "-_.")
    return sum(any(check(c) for c in s) for check in checks)


def _high_entropy(s: str) -> bool:
    return len(s) >= 20 and _classes(s) >= 2 and _entropy(s) >= 3.5


def _password_like(s: str) -> bool:
    return len(s) >= 8 and any(not c.isalpha() and c not in "-_." for c in s)


def _marked(m: re.Match[str], group: str) -> bool:
    """Is this value already redacted (or does MARK follow it, e.g. `token=sk-[REDACTED]`)?"""
    return MARK in m.group(group) or m.string.startswith(MARK, m.end(group))


def _typed(loose: bool) -> Callable[[re.Match[str]], str | None]:
    def repl(m: re.Match[str]) -> str | None:
        if loose and not _high_entropy(m.group("v")):
            return None
        return m.group("p") + MARK

    return repl


def _keep_prefix(check: Callable[[str], bool]) -> Callable[[re.Match[str]], str | None]:
    def repl(m: re.Match[str]) -> str | None:
        if _marked(m, "v") or not check(m.group("v")):
            return None
        return m.group(0)[: m.start("v") - m.start()] + MARK + m.group(0)[m.end("v") - m.start() :]

    return repl


def _basic_credentials(token: str) -> bool:
    try:
        return b":" in binascii.a2b_base64(token.encode(), strict_mode=True)
    except (binascii.Error, ValueError):
        return False


def _assignment(m: re.Match[str]) -> str | None:
    key, val = m.group("key"), m.group("val")
    quoted = val[0] in "\"'"
    inner = val[1:-1] if quoted else val
    if _marked(m, "val") or not inner.strip() or inner.strip().lower() in _NOT_SECRET:
        return None
    if inner.startswith(("${", "{{", "<", "%(")) or (
        not quoted and m.string[m.end() : m.end() + 1] in ("(", "[")
    ):
        return None
    if not quoted and (_CODE_VALUE.fullmatch(inner) or inner.lower() == key.lower()):
        return None
    if _PASSWORD_KEY.search(key):
        ok = True
    elif _STRONG_KEY.search(key):
        ok = not (inner.isdigit() and len(inner) < 8)
    else:
        ok = bool(_WEAK_KEY.search(key)) and _high_entropy(inner)
    if ok and not quoted and m.group("op") == ":":
        rest = m.string[m.end() : m.end() + 256].split("\n", 1)[0]
        tail = rest.strip(" \t,;")
        ok = not tail or tail[0] == "#" or _password_like(inner) or _high_entropy(inner)
    if not ok:
        return None
    q = val[0] if quoted else ""
    return m.group("key") + m.group("mid") + q + MARK + q


_WHOLE_LINE = re.compile(
    r"(?<![A-Za-z0-9_])(?P<key>(?i:[A-Za-z0-9_.-]{0,48}?(?:password|passwd|passphrase)))"
    r"(?P<mid>(?:[\"'`]|\*\*)?[ \t]{0,4}(?P<op>:=|=>|[:=](?!=))[ \t]{0,4})"
    r"(?P<val>[^\s\"'`][^\n]*?)(?P<end>[ \t]*(?:[ \t]#[^\n]*)?$)",
    re.M,
)


def _whole_line(m: re.Match[str]) -> str | None:
    """`password = correct horse battery staple`, `Password=Tr0ub4dor&3`: for a plain password
    key, the rest of the line is the value, spaces and punctuation included, once its first
    word passes the same checks as any assignment (so code such as `password = get()` stays)."""
    first = re.match(r"[^\s\"'`,;&()\[\]{}<>]+", m.group("val"))
    if first is None or m.group("key").startswith("-"):
        return None  # a command-line flag (`--password=x db`): its value ends at a space
    probe = _ASSIGN.match(m.group("key") + m.group("mid") + first.group(0))
    if probe is None or _assignment(probe) is None:
        return None
    if m.string[m.start("val") + first.end() : m.start("val") + first.end() + 1] in ("(", "["):
        return None
    return m.group("key") + m.group("mid") + MARK + m.group("end")


def _next_line(m: re.Match[str]) -> str | None:
    val = m.group("val").strip()
    if MARK in val or val.lower() in _NOT_SECRET or val.startswith(("${", "{{", "<")):
        return None
    return m.group("head") + MARK


def _context(m: re.Match[str]) -> str | None:
    val = m.group("val").rstrip(".")
    if not re.search(r"[ \t:=]", m.group("gap")) or _marked(m, "val") or _CODE_VALUE.fullmatch(val):
        return None
    word = m.group("word").lower()
    if not (
        _high_entropy(val) or (word.startswith("pass") or word == "pwd") and _password_like(val)
    ):
        return None
    return (
        m.group("word")
        + m.string[m.end("word") : m.start("val")]
        + MARK
        + m.group("val")[len(val) :]
    )


def _sub(
    pattern: re.Pattern[str], repl: Callable[[re.Match[str]], str | None], text: str
) -> tuple[str, int]:
    count = 0

    def wrapped(m: re.Match[str]) -> str:
        nonlocal count
        out = repl(m)
        if out is None:
            return m.group(0)
        count += 1
        return out

    return pattern.sub(wrapped, text), count


def _blank_body(body: str) -> tuple[str, bool]:
    """Replace the content of every non-blank line of `body` by MARK, keeping its indentation."""
    lines, changed = body.split("\n"), False
    for i, line in enumerate(lines):
        core = line.strip()
        if core and core != MARK:
            lead = line[: len(line) - len(line.lstrip())]
            lines[i] = lead + MARK + line[len(line.rstrip()) :]
            changed = True
    return "\n".join(lines), changed


def _redact_pem(text: str) -> tuple[str, int]:
    out: list[str] = []
    pos = count = 0
    while (begin := _PEM_BEGIN.search(text, pos)) is not None:
        end = _PEM_END.search(text, begin.end())
        if end is not None:
            body_end = end.start()
        else:  # unterminated: only the key-looking lines right after the BEGIN marker
            body_end = begin.end()
            while body_end < len(text):
                nl = text.find("\n", body_end + 1)
                nl = len(text) if nl < 0 else nl
                segment = text[body_end:nl].lstrip("\n")
                if not _PEM_LINE.fullmatch(segment):
                    break
                body_end = nl
        body, changed = _blank_body(text[begin.end() : body_end])
        out += [text[pos : begin.end()], body]
        count += changed
        pos = body_end
    out.append(text[pos:])
    return "".join(out), count


# Each rule with the literal strings (lower-cased) one of which any match must contain: a text
# holding none of them skips the rule, which is most rules for most text.
_TYPED_NEEDLES: list[tuple[str, ...]] = [
    ("sk-ant-",),
    ("sk-proj-",),
    ("sk-",),
    ("_live_", "_test_"),
    ("aiza",),
    ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ("github_pat_",),
    ("glpat-",),
    ("xox",),
    ("akia", "asia"),
    ("hf_",),
    ("pa-",),
    ("eyj",),
    ("npm_",),
    ("pypi-",),
    ("sg.",),
    (":aa",),
    ("shp",),
    ("dop_v1_",),
    ("ya29.",),
    ("sk",),
    ("key-",),
    ("hooks.slack.com",),
    ("discord",),
]
_KEY_WORDS = ("pass", "pwd", "pw", "secret", "token", "key")
_RULES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str | None], tuple[str, ...]]] = [
    *(
        (pattern, _typed(loose), needles)
        for (pattern, loose), needles in zip(_TYPED_RE, _TYPED_NEEDLES, strict=True)
    ),
    (_URL_CRED, _keep_prefix(lambda v: True), ("://",)),
    (_BEARER, _keep_prefix(lambda v: any(c.isdigit() for c in v)), ("bearer",)),
    (_BASIC, _keep_prefix(_basic_credentials), ("basic",)),
    (_WHOLE_LINE, _whole_line, ("pass",)),
    (_NEXT_LINE, _next_line, _KEY_WORDS),
    (_ASSIGN, _assignment, _KEY_WORDS),
    (_CONTEXT, _context, _KEY_WORDS),
]

# Redacting a whole daily log on every append made appends cost O(file): 8 s for 8.5 MB. The
# rules never match across a line that starts unindented (only _NEXT_LINE spans two lines, the
# second indented; PEM blocks are handled on the whole text first), so the text is redacted in
# such blocks, each remembered: an append redacts only what it added.
_BLOCK = re.compile(r"[^\n]*\n?(?:[ \t]+[^\n]*\n?)*")
# Remembered by a 16-byte digest; the redacted text is kept only for the few blocks that held a
# secret (None: the block comes back unchanged), so 50,000 blocks cost a few MB, not the text.
_MEMO: OrderedDict[bytes, tuple[str, int] | None] = OrderedDict()
_MEMO_BLOCKS = 50_000
_MEMO_LOCK = threading.Lock()


def _redact_block(block: str) -> tuple[str, int]:
    lower = block.lower()
    total = 0
    for pattern, repl, needles in _RULES:
        if any(n in lower for n in needles):
            block, n = _sub(pattern, repl, block)
            if n:
                total += n
                lower = block.lower()
    return block, total


def _redact_blocks(text: str) -> tuple[str, int]:
    out: list[str] = []
    total = 0
    for m in _BLOCK.finditer(text):
        block = m.group(0)
        if not block:
            continue
        key = hashlib.blake2b(block.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        with _MEMO_LOCK:
            known = key in _MEMO
            hit = _MEMO.get(key)
            if known:
                _MEMO.move_to_end(key)
        if not known:
            done = _redact_block(block)
            hit = done if done[1] else None
            with _MEMO_LOCK:
                _MEMO[key] = hit
                while len(_MEMO) > _MEMO_BLOCKS:
                    _MEMO.popitem(last=False)
        if hit is None:
            out.append(block)
        else:
            out.append(hit[0])
            total += hit[1]
    return "".join(out), total


def redact_with_count(text: str) -> tuple[str, int]:
    """Return `text` with secrets replaced by MARK, and how many secrets were replaced."""
    text, total = _redact_pem(text)
    text, n = _redact_blocks(text)
    return text, total + n


def redact(text: str) -> str:
    """Return `text` with secrets replaced by MARK; line structure is unchanged."""
    return redact_with_count(text)[0]
