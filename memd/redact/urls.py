"""Credentials carried by URLs and connection strings: `scheme://user:password@host` of any scheme,
a token standing as the user, signature and token query parameters, `.pgpass` lines.

Named parameters (`password=`, `sig=`, `X-Amz-Signature=`, `AccountKey=`) are names that say
secret and are redacted with every other assignment; this module has what a name does not cover.
"""

from __future__ import annotations

import re

from memd.redact.base import Rule, keep_prefix, regex_rule
from memd.redact.values import high_entropy

# Greedy: a password may hold '@' (the host follows the last one); the user may be an address.
_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s:/\[\]]{0,256}:"
    r"(?P<v>[^\s/]{1,256})@"
)
# `https://<token>@github.com/...`: a random user name is a token.
_TOKEN_USER = re.compile(
    r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,30}://(?P<v>[A-Za-z0-9_.~%+-]{20,256})@"
)
# An unnamed query parameter that is a key by convention: Azure Functions' and OAuth's `code`.
_CODE_PARAM = re.compile(r"[?&#](?i:code)=(?P<v>[A-Za-z0-9_.~%+/=-]{20,})")
# `.pgpass`: host:port:database:user:password, one per line.
_PGPASS = re.compile(
    r"(?m)^(?:[A-Za-z0-9-]+\.[A-Za-z0-9.-]+|localhost|\*|\d{1,3}(?:\.\d{1,3}){3}):(?:\d{1,5}|\*)"
    r":[^\s:]+:[^\s:]+:(?P<v>[^\s]+)[ \t]*$"
)

# (needles, needs a 16-character run, rule)
RULES: list[tuple[tuple[str, ...], bool, Rule]] = [
    (("://",), False, regex_rule(_USERINFO, keep_prefix(lambda v: True))),
    (("://",), True, regex_rule(_TOKEN_USER, keep_prefix(high_entropy))),
    (("code=",), True, regex_rule(_CODE_PARAM, keep_prefix(high_entropy))),
    ((":",), True, regex_rule(_PGPASS, keep_prefix(lambda v: True))),
]
