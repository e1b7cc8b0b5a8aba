"""Values given to a name that says secret, in every notation: `.env`, shell, YAML, JSON, TOML, INI,
XML, HTTP headers, name/value pairs, `.netrc`, and prose ("my password is ...")."""

from __future__ import annotations

import re

from memd.redact.base import (
    MARK,
    Rule,
    keep_prefix,
    marked,
    regex_rule,
    replace_group,
    replace_head,
)
from memd.redact.names import FRAGMENT_RE, FRAGMENTS, Tier, accepts, looks_secret, tier
from memd.redact.values import (
    PLACEHOLDER_STARTS,
    basic_credentials,
    high_entropy,
    is_code,
    password_like,
    random_token,
)

_NAME = rf"[A-Za-z0-9_.-]{{0,48}}?{FRAGMENT_RE}[A-Za-z0-9_.-]{{0,32}}?"
_OP = r"(?P<op>:=|=>|[:=](?![=:]))"
# Quoted, quoted but running on past the line (a wrapped value), or one unquoted word.
_VALUE = (
    r"\"[^\"\n]{1,1024}\"|'[^'\n]{1,1024}'|[\"'][^\"'\n]{8,1024}(?=\n|\Z)|[^\s\"'`,;&()\[\]{}<>]+"
)


def _line_before(m: re.Match[str], group: str = "key") -> str:
    start = m.start(group)
    return m.string[max(m.string.rfind("\n", 0, start) + 1, start - 48) : start]


def _after(m: re.Match[str]) -> str:
    return m.string[m.end() : m.end() + 256].split("\n", 1)[0]


def _split_quotes(val: str) -> tuple[str, str, str]:
    """(opening quote, inner text, closing quote) of a value as the regexes capture it."""
    if val[:1] in ("'", '"'):
        closed = len(val) > 1 and val[-1] == val[0]
        return val[0], val[1:-1] if closed else val[1:], val[0] if closed else ""
    return "", val, ""


_ASSIGN = re.compile(
    # The lookahead rejects, in one pass over it, a word that no operator follows.
    r"(?<![A-Za-z0-9_.$-])(?=[A-Za-z0-9_.-]{1,80}+(?:[\"'`]\]?|\]|\*\*)?[ \t]{0,4}+(?::=|=>|[:=]))"
    rf"(?P<key>{_NAME})"
    rf"(?P<mid>(?:[\"'`]\]?|\]|\*\*)?[ \t]{{0,4}}{_OP}[ \t]{{0,4}})(?P<val>{_VALUE})"
)


def _assignment(m: re.Match[str]) -> str | None:
    key, val = m.group("key"), m.group("val")
    if marked(m, "val") or key.startswith("--no-"):
        return None
    q, inner, close = _split_quotes(val)
    after = _after(m)
    level = tier(key, _line_before(m))
    if not accepts(level, inner, quoted=bool(q), key=key, after=after):
        return None
    if not q and m.group("op") == ":":
        tail = after.strip(" \t,;")  # `Token: the unit a model reads` is prose, not a value
        if tail and tail[0] != "#" and not looks_secret(level, inner):
            return None
    return key + m.group("mid") + q + MARK + close


# `password = correct horse battery staple`: for a password the rest of the line is the value,
# up to a comment or, in a connection string, the next `;Name=`.
_WHOLE_LINE = re.compile(
    r"(?<![A-Za-z0-9_])(?P<key>[A-Za-z0-9_.-]{0,48}?(?i:pass(?:word|wd|phrase|code)))"
    r"(?P<mid>(?:[\"'`]|\*\*)?[ \t]{0,4}(?P<op>:=|=>|[:=](?!=))[ \t]{0,4})"
    r"(?P<val>[^\s\"'`][^\n]*?)"
    r"(?P<end>[ \t]*(?:[ \t]#[^\n]*)?$|(?=[;&][ \t]*[A-Za-z][A-Za-z0-9_ \t]{0,30}=))",
    re.M,
)


# Words of prose that a passphrase of random words would hardly hold: `Password: see the vault`.
_PROSE = frozenset(
    {"the", "a", "an", "in", "on", "at", "of", "to", "for", "with", "from", "by", "is", "are"}
    | {"was", "and", "or", "not", "see", "ask", "use", "under", "our", "my", "your", "it"}
)


def _whole_line(m: re.Match[str]) -> str | None:
    first = re.match(r"[^\s\"'`,;&()\[\]{}<>]+", m.group("val"))
    key = m.group("key")
    if first is None or key.startswith("-") or tier(key) is not Tier.PASSWORD:
        return None  # a command-line flag (`--password=x db`) ends at a space
    rest = m.group("val")[first.end() :]
    if m.group("val").startswith(PLACEHOLDER_STARTS) or not accepts(
        Tier.PASSWORD, first.group(0), key=key, after=rest
    ):
        return None
    words = m.group("val").lower().split()
    if m.group("op") == ":" and len(words) > 1 and not _PROSE.isdisjoint(words):
        return None  # prose after a label, left to the one-word rule below
    return key + m.group("mid") + MARK + m.group("end")


# A name alone on its line, the value on the next, indented (YAML), or a block scalar's lines.
_NEXT_LINE = re.compile(
    rf"(?m)^(?P<indent>[ \t]*)(?P<head>-?[ \t]*[\"']?(?P<key>{_NAME})[\"']?[ \t]*:[ \t]*"
    r"(?P<scalar>[|>][-+]?[0-9]?)?[ \t]*\n)(?P<rest>(?:[ \t]+[^\n]*(?:\n|\Z))+)"
)
_MAPPING = re.compile(r"-?[ \t]*[\"']?[A-Za-z0-9_.-]+[\"']?[ \t]*:(?:[ \t]|$)")


def _next_line(m: re.Match[str]) -> str | None:
    level = tier(m.group("key"))
    scalar = m.group("scalar") is not None
    depth = len(m.group("indent").expandtabs())
    lines = m.group("rest").split("\n")
    body = [i for i, line in enumerate(lines) if line.strip()]
    end = next((i for i in body if len(lines[i]) - len(lines[i].lstrip()) <= depth), len(lines))
    body = [i for i in body if i < end][: None if scalar else 1]
    if level is Tier.NONE or not body or MARK in lines[body[0]]:
        return None
    cores = [lines[i].strip() for i in body]
    if scalar:
        joined = "".join(cores)
        if level is Tier.ENTROPY and (" " in joined or not high_entropy(joined)):
            return None
        if not accepts(max(level, Tier.STRONG), cores[0], quoted=True):
            return None
    else:
        q, inner, _ = _split_quotes(cores[0])
        if _MAPPING.match(cores[0]) or not accepts(level, inner, quoted=bool(q)):
            return None  # a nested mapping (`credentials:\n  user: x`) is not a value
    for i in body:
        lines[i] = lines[i][: len(lines[i]) - len(lines[i].lstrip())] + MARK
    return m.group("indent") + m.group("head") + "\n".join(lines)


# A label alone on its line and the value alone on the next, as notes are written:
# "Wi-Fi password:" then "Tr0ub4dor&3".
_LABEL_LINE = re.compile(
    r"(?m)^(?P<head>[ \t]*(?:[-*+][ \t]+)?(?:\*\*)?(?P<key>[A-Za-z][A-Za-z0-9 _.-]{0,47})"
    r"(?:\*\*)?[ \t]*:(?:\*\*)?[ \t]*\n[ \t]*)(?P<v>[^\s]+)[ \t]*$"
)


def _label_line(m: re.Match[str]) -> str | None:
    key, value = m.group("key"), m.group("v")
    level = tier(key)
    if level < Tier.STRONG or marked(m, "v") or not accepts(level, value, key=key):
        return None
    return m.group("head") + MARK if looks_secret(level, value) else None


# `<password>...</password>`, `<ClientSecret>...</ClientSecret>`.
_XML = re.compile(
    rf"<(?P<tag>[A-Za-z0-9_:.-]{{0,40}}?{FRAGMENT_RE}[A-Za-z0-9_:.-]{{0,20}})(?:[ \t][^<>\n]*)?>"
    r"(?P<v>[^<\n]{1,1024})</(?P=tag)>"
)
# A name field that says secret and the value field after it: Kubernetes `env`, .NET `<add
# key="ApiKey" value="..."/>`, JSON `{"name": "API_TOKEN", "value": "..."}`, or the element's
# text: `<entry key="password">...</entry>`.
_NAME_VALUE = re.compile(
    r"(?<![A-Za-z0-9_])(?:(?i:name|key)[\"']?[ \t]*[:=][ \t]*|variable[ \t]+)[\"']?"
    r"(?P<name>[A-Za-z0-9_.-]{1,64})[\"']?"
    r"(?:[^\n]{0,80}?(?:\n[ \t]+[^\n]{0,40}?)?(?<![A-Za-z0-9_])(?i:value|default)[\"']?[ \t]*[:=][ \t]*"
    r"(?P<v>\"[^\"\n]{1,1024}\"|'[^'\n]{1,1024}'|[^\s\"',}/>]+)"
    r"|[^<>\n]{0,80}?>(?P<w>[^<\n]{1,1024})</)"
)


def _tagged(pattern: re.Pattern[str], name: str) -> Rule:
    def replace(m: re.Match[str]) -> str | None:
        group = "v" if m.groupdict().get("v") is not None else "w"
        q, inner, close = _split_quotes(m.group(group))
        if marked(m, group) or not accepts(tier(m.group(name)), inner, quoted=True):
            return None
        whole, start = m.group(0), m.start()
        return whole[: m.start(group) - start] + q + MARK + close + whole[m.end(group) - start :]

    return regex_rule(pattern, replace)


# A quoted name and a quoted value as the two arguments of a call: PHP `define('DB_PASSWORD',
# '...')`, `setenv("API_KEY", "...")`, `os.environ.setdefault("SECRET_KEY", "...")`.
_CALL_PAIR = re.compile(
    rf"\([ \t]*[\"'](?P<name>[A-Za-z0-9_.-]{{0,48}}{FRAGMENT_RE}[A-Za-z0-9_.-]{{0,32}})[\"'][ \t]*,[ \t]*"
    r"(?P<v>\"[^\"\n]{1,1024}\"|'[^'\n]{1,1024}')"
)
# A password given positionally after a DSN and a user: `DriverManager.getConnection(url,
# "app", "...")`, `new PDO($dsn, 'app', '...')`, `mysqli_connect("db", "app", "...")`.
_ARG = r"(?:\"[^\"\n]{0,512}\"|'[^'\n]{0,512}'|\$?[A-Za-z_][\w.]*)"
_CONNECT_CALL = re.compile(
    rf"(?i:getConnection|new[ \t]+PDO|mysqli(?:_connect|_real_connect)?|pg_connect)[ \t]*\([ \t]*"
    rf"{_ARG}[ \t]*,[ \t]*{_ARG}[ \t]*,[ \t]*(?P<v>\"[^\"\n]{{1,512}}\"|'[^'\n]{{1,512}}')"
)
# SQL: `IDENTIFIED BY '...'`, `WITH PASSWORD '...'`, DB2 `USER x USING ...`.
_SQL = re.compile(
    r"(?i)(?<![A-Za-z0-9_])(?:identified[ \t]+(?:with[ \t]+\w+[ \t]+)?by(?:[ \t]+password)?"
    r"|password|user[ \t]+\S+[ \t]+using)[ \t]+(?P<v>'[^'\n]{1,512}'|\"[^\"\n]{1,512}\"|[^\s'\";,)]+)"
)


def _literal(m: re.Match[str]) -> str | None:
    q, inner, close = _split_quotes(m.group("v"))
    name = m.groupdict().get("name") or "password"
    if marked(m, "v") or not accepts(tier(name), inner, quoted=bool(q), key=name):
        return None
    if (not q and m.re is _SQL or m.re is _CALL_PAIR) and not looks_secret(tier(name), inner):
        return None  # prose: "identified by name"; a label: `t('password', 'Passwort')`
    whole, start = m.group(0), m.start()
    return whole[: m.start("v") - start] + q + MARK + close + whole[m.end("v") - start :]


# Dockerfile `ENV API_TOKEN abc`, Windows `setx KEY "..."`, fish `set -gx TOKEN ...`.
_DIRECTIVE = re.compile(
    rf"(?m)^[ \t]*(?:ENV|setx|set[ \t]+-[gxU]+)[ \t]+(?P<key>[A-Za-z0-9_.-]*{FRAGMENT_RE}[A-Za-z0-9_.-]*)"
    r"[ \t]+(?P<v>\"[^\"\n]{1,1024}\"|'[^'\n]{1,1024}'|[^\s\"'=][^\s]*)[ \t]*$"
)
# `.netrc`: `machine host login me password secret`.
_NETRC = re.compile(
    r"(?m)^(?=[^\n]*(?<![A-Za-z0-9_])(?:machine|default)(?![A-Za-z0-9_]))[^\n]*?"
    r"(?<![A-Za-z0-9_])(?:password|passwd)[ \t]+(?P<v>[^\s]+)"
)


def _spaced(m: re.Match[str]) -> str | None:
    q, inner, _ = _split_quotes(m.group("v"))
    key = m.groupdict().get("key") or "password"
    if marked(m, "v") or not accepts(tier(key), inner, quoted=bool(q), key=key):
        return None
    return replace_group(m, "v")


# Authorization headers of any scheme: `Token abc...`, `ApiKey ...`, `SSWS ...`, or none.
_AUTHORIZATION = re.compile(
    r"(?i)(?<![A-Za-z0-9_-])(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
    r"(?:[A-Za-z][A-Za-z0-9._-]{1,30}[ \t]+)?(?P<v>[A-Za-z0-9._~+/=:-]{12,})"
)
_BEARER = re.compile(r"(?<![A-Za-z0-9_])(?i:bearer)[ \t]{1,4}(?P<v>[A-Za-z0-9._~+/=-]{16,})")
_BASIC = re.compile(
    r"(?<![A-Za-z0-9_])(?i:basic)[ \t]{1,4}(?P<v>[A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])"
)

# Prose: "my password is hunter2!", "the signing key is <random>".
# ... and its other turns: "was changed to ...", "is now ...", "token -> ...", "password →
# ...", "the API token (...) expires", "pw Hunter22!".
_CONTEXT = re.compile(
    r"(?<![A-Za-z0-9_])(?P<word>(?i:pass(?:word|phrase)?|passwd|pwd|pw|secret|token|key))s?"
    r"(?P<gap>(?:[ \t]{1,3}(?i:is|was|are|has[ \t]been)"
    r"(?:[ \t]{1,3}(?i:now|still|set|changed|reset|updated))?(?:[ \t]{1,3}(?i:to))?(?![A-Za-z]))?"
    r"[ \t]{0,3}(?:(?:[:=(]|->|=>|→)[ \t]{0,3})?[\"'`]?)"
    r"(?P<val>[A-Za-z0-9+/_.=~!@#$%^&*-]{8,})"
)


def _context(m: re.Match[str]) -> str | None:
    val = m.group("val").rstrip(".")
    if not re.search(r"[ \t:=(>→]", m.group("gap")) or marked(m, "val"):
        return None
    if is_code(val):
        return None
    word = m.group("word").lower()
    is_password = word.startswith("pass") or word in ("pwd", "pw")
    if word in ("pass", "pw") and not (any(c.isalpha() for c in val) and _has_digit(val)):
        return None  # "pass 2024-01-01", "pw ********": a word and a value, but not one
    if not (random_token(val) or is_password and password_like(val)):
        return None
    return replace_head(m, "val", len(val))


# A label of a few words before its colon, the word that says secret not last, or a remark in
# brackets after it: "API key (don't share): ...", "PAT for Azure DevOps: ...". The phrase's
# words are read as a name's (the last first, a remark in brackets left out); being prose, the
# value must be random whatever the name says. A long value after a colon is rare in prose, so
# it is found first and the label looked for in the few words before it.
_PHRASE_VALUE = re.compile(r"[:=][ \t]{0,4}[\"'`]?(?P<val>[^\s\"'`,;()\[\]{}<>]{16,})")
_PHRASE_LABEL = re.compile(
    rf"(?<![A-Za-z0-9_])(?P<key>[A-Za-z0-9_.-]{{0,48}}?{FRAGMENT_RE}[A-Za-z0-9_.-]{{0,32}}"
    r"(?:[ \t]{1,2}(?:\([^()\n]{0,40}\)|[A-Za-z][A-Za-z0-9'._-]{0,24})){1,6})[ \t]{0,2}\Z"
)


def _phrase(text: str) -> tuple[str, int]:
    out: list[str] = []
    done = count = 0
    for m in _PHRASE_VALUE.finditer(text):
        val = m.group("val").rstrip(".")
        if marked(m, "val") or not random_token(val) or is_code(val):
            continue
        line_start = max(text.rfind("\n", 0, m.start()) + 1, m.start() - 160)
        label = _PHRASE_LABEL.search(text, line_start, m.start())
        if label is None:
            continue
        name = re.sub(r"\([^()]*\)", " ", label.group("key"))
        if tier(name, text[line_start : label.start()]) is Tier.NONE:
            continue
        out += (text[done : m.start("val")], MARK)
        done = m.start("val") + len(val)
        count += 1
    return "".join(out) + text[done:], count


def _has_digit(v: str) -> bool:
    return any(c.isdigit() for c in v)


def _has_digit_or_random(v: str) -> bool:
    return _has_digit(v) or high_entropy(v)


# (needles, rule) in the order they run: whole-line passwords before single words.
RULES: list[tuple[tuple[str, ...], Rule]] = [
    (("authorization",), regex_rule(_AUTHORIZATION, keep_prefix(_has_digit_or_random))),
    (("bearer",), regex_rule(_BEARER, keep_prefix(lambda v: any(c.isdigit() for c in v)))),
    (("basic",), regex_rule(_BASIC, keep_prefix(basic_credentials))),
    (("</",), _tagged(_XML, "tag")),
    (("value", "default", "</"), _tagged(_NAME_VALUE, "name")),
    (("env", "set"), regex_rule(_DIRECTIVE, _spaced)),
    (("(",), regex_rule(_CALL_PAIR, _literal)),
    (("connect", "pdo"), regex_rule(_CONNECT_CALL, _literal)),
    (("identified", "password", "using"), regex_rule(_SQL, _literal)),
    (("machine", "default"), regex_rule(_NETRC, _spaced)),
    (("pass", "pwd"), regex_rule(_WHOLE_LINE, _whole_line)),
    (FRAGMENTS, regex_rule(_NEXT_LINE, _next_line)),
    (FRAGMENTS, regex_rule(_LABEL_LINE, _label_line)),
    (FRAGMENTS, regex_rule(_ASSIGN, _assignment)),
    (FRAGMENTS, _phrase),
    (("pass", "pwd", "pw", "secret", "token", "key"), regex_rule(_CONTEXT, _context)),
]
