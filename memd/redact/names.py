"""Names that say secret: the words of a key, variable, flag, header, tag or column, and how sure
they make us that its value is a secret."""

from __future__ import annotations

import re
from enum import IntEnum

from memd.redact.values import (
    basic_credentials,
    high_entropy,
    not_a_secret,
    password_like,
    random_token,
)


class Tier(IntEnum):
    """How much a name says about its value."""

    NONE = 0  # `author`, `keyboard`, `token_budget_notes`: nothing
    ENTROPY = 1  # `sort_key`, `stripe_sig`, `token_hash`: a secret only if the value looks random
    STRONG = 2  # `token`, `client_secret`, `API key`: any value but code and short numbers
    PASSWORD = 3  # `password`, `PGPASSWORD`, `dbPass`: any value but code and placeholders


# Words of a name in any spelling: DB_PASSWORD, dbPassword, db-password, db.password, "DB password".
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_PASSWORD = frozenset({"pass", "pw", "pwd", "pswd", "passwd", "password", "passphrase", "passcode"})
_PASSWORD_ENDS = ("password", "passwd", "passphrase", "pwd", "storepass", "keypass")
_STRONG = frozenset(
    {"secret", "secrets", "token", "credential", "credentials", "creds", "cred", "jwt", "bearer"}
    | {"pat"}  # personal access token: GH_PAT, AZURE_DEVOPS_EXT_PAT
)
_STRONG_ENDS = (
    *("secret", "token", "apikey", "accesskey", "secretkey", "privatekey", "authkey"),
    *("masterkey", "credential", "credentials", "dockerconfigjson", "dockercfg"),
)
# `<qualifier> key` is as sure as `token`: API key, access key, signing key, account key.
_KEY_QUALIFIERS = frozenset(
    {
        *("api", "access", "secret", "private", "auth", "master", "signing", "encryption"),
        *("account", "shared", "sharedaccess", "subscription", "client", "app", "license"),
        *("deploy", "consumer", "hmac", "sas", "storage", "service", "webhook", "bot", "admin"),
        *("root", "ssh", "gpg", "pgp", "crypto", "cipher", "decryption", "wrapping", "session"),
    }
)
_ENTROPY = frozenset(
    {"key", "auth", "sig", "signature", "hmac", "salt", "seed", "sid", "session", "cookie"}
    | {"otp", "totp", "mfa", "sessionid"}
)
_ENTROPY_ENDS = ("sessionid", "sessid")
_ANY_WORD = _PASSWORD | _STRONG | _ENTROPY
# Literal fragments one of which any secret-saying name holds: their regexes require one inside
# the name, and rules look for one (lower-cased) before running.
_FRAGMENTS = (
    *("pass", "pw", "secret", "token", "key", "auth", "cred", "sig", "hmac", "salt", "seed"),
    *("sid", "sess", "cookie", "otp", "jwt", "bearer", "dockerc", "mfa"),
)
# `pat` only at a word's end (GH_PAT, ghPat), not in `path` or `pattern`.
FRAGMENT_RE = "(?i:" + "|".join(_FRAGMENTS) + "|pat(?![a-z]))"
FRAGMENTS = (*_FRAGMENTS, *(f"pat{c}" for c in "=:\"' \t-`*>"))
_PREVIOUS_WORD = re.compile(r"([A-Za-z]+)[ \t]{1,2}$")


def tier(name: str, before: str = "") -> Tier:
    """How sure `name` makes us that its value is a secret.

    Args:
        name: the key, variable, flag, header, tag or column name.
        before: text before the name on its line, whose last word may qualify it ("API key").
    """
    words = [w.lower() for w in _WORDS.findall(name)]
    if not words:
        return Tier.NONE
    last = words[-1]
    if last in _PASSWORD or last.endswith(_PASSWORD_ENDS):
        return Tier.PASSWORD
    if last in _STRONG or last.endswith(_STRONG_ENDS):
        return Tier.STRONG
    if last == "key":
        previous = words[-2] if len(words) > 1 else ""
        if not previous and (m := _PREVIOUS_WORD.search(before[-40:])):
            previous = m.group(1).lower()
        if previous in _KEY_QUALIFIERS:
            return Tier.STRONG
    if last in _ENTROPY or last.endswith(_ENTROPY_ENDS) or any(w in _ANY_WORD for w in words):
        return Tier.ENTROPY
    return Tier.NONE


def accepts(
    level: Tier, inner: str, *, quoted: bool = False, key: str = "", after: str = ""
) -> bool:
    """Is `inner` a secret when a name of `level` holds it?

    Args:
        level: what the name says.
        inner: the value without its quotes.
        quoted: whether the value was quoted.
        key: the name (a value equal to it passes a variable on).
        after: the text after the value on its line.
    """
    if level is Tier.NONE or not_a_secret(inner, quoted=quoted, key=key, after=after):
        return False
    if level is Tier.PASSWORD:
        return True
    if level is Tier.STRONG:
        return not (inner.isdigit() and len(inner) < 8)
    return random_token(inner) or basic_credentials(inner)


def looks_secret(level: Tier, inner: str) -> bool:
    """Is `inner` secret-shaped enough to take from a line that goes on in prose?

    `Token: the unit a model reads` keeps "the"; `Password: hunter2! (old)` loses "hunter2!".
    """
    if level is Tier.ENTROPY:
        return random_token(inner)
    return password_like(inner) or high_entropy(inner)
