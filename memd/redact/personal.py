"""Secrets people keep for themselves rather than for programs: a password named in the
language the note is written in, recovery and backup codes, a wallet's seed phrase, a PIN, a
payment card's number and security code."""

from __future__ import annotations

import re

from memd.redact.base import MARK, Rule, keep_prefix, marked, regex_rule, replace_head
from memd.redact.values import is_code, password_like

# "Password" in the languages notes are written in, then a colon or the language's "is":
# "Mein Passwort ist ...", "mot de passe : ...", "密码是...", "パスワードは ...". The value must
# look like a password (8 characters or more, with a digit or a symbol), as in English prose.
_FOREIGN_WORDS = (
    *("passwort", "kennwort", "mot de passe", "contraseña", "contrasena", "senha", "password"),
    *("wachtwoord", "lösenord", "passord", "adgangskode", "salasana", "hasło", "heslo"),
    *("jelszó", "parola", "şifre", "sifre", "пароль", "密码", "密碼", "口令", "パスワード"),
    *("暗証番号", "비밀번호", "암호", "סיסמה", "كلمة المرور", "mật khẩu", "รหัสผ่าน", "kata sandi"),
)
_COPULAS = ("ist", "lautet", "est", "es", "é", "è", "is", "er", "är", "on", "jest", "je", "to")
_FOREIGN = re.compile(
    r"(?i)(?P<word>" + "|".join(map(re.escape, _FOREIGN_WORDS)) + r")"
    r"(?P<gap>(?:[ \t]+[^\s:：=]{1,20}?){0,3}?"
    r"(?:[ \t]*[:：=]|[ \t]+(?:" + "|".join(_COPULAS) + r")[ \t]|[ \t]*[-—–][ \t]|[是为為はが는은])"
    r"[ \t]*)"
    r"[\"'`「『“]?(?P<val>[^\s\"'`「」『』“”、，,;]{8,})"
)
_DATE_LIKE = re.compile(r"[0-9T:./+-]+")  # "Passwort geändert am: 2026-12-01T10:00"
# English "password" is the other rules' business; here it is Italian ("la password è").
FOREIGN_NEEDLES = (*(w.lower() for w in _FOREIGN_WORDS if w != "password"), "password è")


def _foreign(m: re.Match[str]) -> str | None:
    val = m.group("val").rstrip(".。")
    if marked(m, "val") or not password_like(val) or is_code(val) or _DATE_LIKE.fullmatch(val):
        return None
    if m.group("word").lower() == "password" and "è" not in m.group("gap"):
        return None  # English is the other rules' (code such as `password = getpass()`)
    return replace_head(m, "val", len(val))


# Recovery and backup codes, which come as a list: "the 2FA recovery codes are 8d2f-91ac,
# 1c7e-0d44", "Backup codes: 4821 9930 1177". Each code with a digit in it goes.
_CODES = re.compile(
    r"(?i)(?<![A-Za-z0-9])(?:recovery|backup|2fa|mfa|one-time|emergency)[ \t-](?:codes?|keys?)"
    r"(?P<gap>[ \t]{1,3}(?:are|is|were)[ \t]{1,3}|[ \t]{0,2}:[ \t]{0,3})"
    r"(?P<list>[A-Za-z0-9-]{4,}(?:(?:[ \t]*[,;][ \t]*(?:and[ \t]+)?|[ \t]+)[A-Za-z0-9-]{4,}){0,23})"
)
_CODE = re.compile(r"[A-Za-z0-9-]{4,}")


def _codes(m: re.Match[str]) -> str | None:
    items = _CODE.findall(m.group("list"))
    if not all(any(c.isdigit() for c in item) for item in items) or marked(m, "list"):
        return None  # prose after the label: "Backup codes: print them and keep them safe"
    whole, start = m.group(0), m.start()
    return whole[: m.start("list") - start] + _CODE.sub(MARK, m.group("list"))


# What opens a wallet or pays: a wallet's seed phrase (12 to 24 words after its label), a PIN,
# a card's number (Luhn-valid, in a line that speaks of a card) and its security code.
_SEED = re.compile(
    r"(?i)(?<![A-Za-z])(?:(?:seed|recovery|mnemonic|backup|secret[ \t]recovery)[ \t]phrase"
    r"|mnemonic|seed[ \t]words)"
    r"(?P<gap>[ \t]{1,3}(?:is|was|are)[ \t]{1,3}|[ \t]{0,2}[:=][ \t]{0,3})[\"'`]?"
    r"(?P<v>[a-z]{3,8}(?:[ \t]+[a-z]{3,8}){11,23})(?![A-Za-z])"
)
_PIN = re.compile(
    r"(?i)(?<![A-Za-z0-9])(?:(?:pin|pin[ \t]code|passcode)(?=[ \t]{0,3}[:=#iw])|cvv2?|cvc2?|csc)"
    r"(?P<gap>[ \t]{1,3}(?:is|was)[ \t]{1,3}|[ \t]{0,2}[:=#][ \t]{0,3}|[ \t])(?P<v>\d{3,8})(?![\d.,/-])"
)
_CARD = re.compile(r"(?<![\d-])(?P<v>[3-6](?:[ -]?\d){12,18})(?![\d-])")


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def _card(m: re.Match[str]) -> str | None:
    digits = re.sub(r"[ -]", "", m.group("v"))
    if not 13 <= len(digits) <= 19 or not _luhn(digits) or len(set(digits)) < 2:
        return None
    return MARK


RULES: list[tuple[tuple[str, ...], Rule]] = [
    (FOREIGN_NEEDLES, regex_rule(_FOREIGN, _foreign)),
    (("recovery", "backup", "2fa", "mfa", "one-time", "emergency"), regex_rule(_CODES, _codes)),
    (("phrase", "mnemonic", "seed"), regex_rule(_SEED, keep_prefix(lambda v: True))),
    (("pin", "passcode", "cvv", "cvc", "csc"), regex_rule(_PIN, keep_prefix(lambda v: True))),
    (("card", "visa", "amex", "credit", "debit"), regex_rule(_CARD, _card)),
]
