"""Tokens that announce themselves by a known prefix: provider API keys, vault, runner and registry
tokens, JWTs. The prefix is kept (`ghp_[REDACTED]`) so a reader still knows what was there."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable

from memd.redact.base import MARK, Rule, regex_rule
from memd.redact.values import classes, high_entropy, random_token


def _credential_json(body: str) -> bool:
    """Is `eyJ` + `body` base64 of a JSON object holding credentials (a registry config)?"""
    raw = "eyJ" + body
    try:
        data = json.loads(base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=b"-_"))
    except (binascii.Error, ValueError, RecursionError):
        return False
    text = json.dumps(data).lower()
    return any(f'"{k}' in text for k in ("auth", "pass", "token", "secret", "key", "cred"))


def _private_key_base64(body: str) -> bool:
    """Is `LS0tLS1CRUdJT` + `body` base64 of a PEM private key (kubeconfig `client-key-data`)?"""
    raw = "LS0tLS1CRUdJT" + body
    try:
        head = base64.b64decode(raw[: len(raw) // 4 * 4][:200])
    except (binascii.Error, ValueError):
        return False
    return b"PRIVATE KEY" in head


Check = Callable[[str], bool]
_ANY = r"[A-Za-z0-9_-]"
# (prefix, body, check): the prefix is kept, the body replaced when `check` (if any) accepts it.
# A body's length is a lower bound wherever the prefix alone is rare enough: a provider that
# lengthens its tokens, or a token quoted a character short, is still a token.
# A prefix starts with a literal character, an escaped one or a `[...]` class of letters: the
# scanner picks the entries to try by the first character of each token.
TABLE: list[tuple[str, str, Check | None]] = [
    # AI providers
    (r"sk-ant-", _ANY + "{20,}", None),
    (r"sk-proj-", _ANY + "{20,}", None),
    (r"sk-", _ANY + "{20,}", high_entropy),  # sk-svcacct-, sk-admin-, sk-or-v1-, DeepSeek ...
    (r"xai-", r"[A-Za-z0-9]{40,}", None),
    (r"gsk_", r"[A-Za-z0-9]{40,}", None),
    (r"pplx-", r"[A-Za-z0-9]{32,}", None),
    (r"r8_", r"[A-Za-z0-9]{30,}", high_entropy),
    (r"nvapi-", _ANY + "{40,}", None),
    (r"tvly-", _ANY + "{24,}", None),
    (r"hf_", r"[A-Za-z0-9]{30,}", high_entropy),
    (r"pa-", _ANY + "{20,}", high_entropy),
    (r"lsv2_(?:pt|sk)_", r"[A-Za-z0-9_]{32,}", None),
    # code hosts, CI runners, package registries
    (r"gh[pousr]_", r"[A-Za-z0-9]{30,}", None),
    (r"github_pat_", r"[A-Za-z0-9_]{22,}", None),
    (r"gl(?:pat|ptt|rt|dt|cbt|imt|oas|soat|ffct|ft|agent|wt)-", _ANY + "{20,}", None),
    (r"GR1348941", _ANY + "{20,}", None),
    (r"npm_", r"[A-Za-z0-9]{30,}", None),
    (r"pypi-", r"AgE" + _ANY + "{50,}", None),
    (r"rubygems_", r"[a-f0-9]{40,}", None),
    (r"oy2", r"[a-z0-9]{43}", None),
    (r"dckr_(?:pat|oat)_", _ANY + "{20,}", None),
    # clouds and platforms
    (r"A[KS]IA", r"[A-Z0-9]{16}", None),
    (r"AIza", _ANY + "{30,}", None),
    (r"ya29\.", _ANY + "{20,}", None),
    (r"1//0", _ANY + "{40,}", None),  # Google OAuth refresh token
    (r"GOCSPX-", _ANY + "{24,}", None),
    (r"do[por]_v1_", r"[a-f0-9]{40,}", None),
    (r"dapi", r"[a-f0-9]{32}(?:-\d)?", None),
    (r"sbp_", r"[a-f0-9]{32,}", None),
    (r"pscale_(?:tkn|pw|oauth)_", r"[A-Za-z0-9_.-]{32,}", None),
    (r"dp\.(?:pt|st|ct|sa|scim|audit)\.(?:[a-z0-9_-]{1,30}\.)?", r"[A-Za-z0-9]{40,}", None),
    (r"fm[12]_", r"[A-Za-z0-9_+/=-]{40,}", None),  # Fly.io
    (r"fo1_", _ANY + "{40,}", None),
    (r"rnd_", r"[A-Za-z0-9]{32,}", None),
    (r"nfp_", r"[A-Za-z0-9]{36,}", None),
    (r"ATATT3", r"[A-Za-z0-9_=-]{100,}", None),  # Atlassian
    (r"ops_eyJ", _ANY + "{40,}", None),  # 1Password service account
    # HashiCorp Vault: service, batch, recovery tokens and the older `s.` ones
    (r"hv[sbr]\.", _ANY + "{24,}", None),
    (r"s\.", r"[A-Za-z0-9]{24}", high_entropy),
    # messaging, payments, mail, observability, productivity
    (r"sk\.eyJ", _ANY + r"{20,}\." + _ANY + "{20,}", None),  # Mapbox secret token
    (r"https://[A-Za-z0-9-]+\.webhook\.office\.com/webhookb2/", r"[A-Za-z0-9@/_-]{40,}", None),
    (r"xox[abeprs][.-](?:xox[abp]-)?", r"[A-Za-z0-9-]{10,}", None),
    (r"xapp-", r"[A-Za-z0-9-]{30,}", None),
    (r"[srp]k_(?:live|test)_", r"[A-Za-z0-9]{10,}", None),
    (r"whsec_", r"[A-Za-z0-9+/=]{24,}", None),
    (r"sq0(?:atp|csp)-", _ANY + "{22,}", None),
    (r"EAA", r"[A-Za-z0-9]{100,}", high_entropy),  # Meta Graph API
    (r"shp(?:at|ca|pa|ss)_", r"[a-fA-F0-9]{28,}", None),
    (r"SG\.", _ANY + r"{16,}\." + _ANY + "{30,}", None),
    (r"x(?:keysib|smtpsib)-", r"[a-f0-9]{64}-[A-Za-z0-9]{16}", None),
    (r"key-", r"[0-9a-f]{32}", None),  # Mailgun
    (r"SK", r"[0-9a-f]{32}", None),  # Twilio
    (r"lin_api_", r"[A-Za-z0-9]{32,}", None),
    (r"ntn_", r"[A-Za-z0-9]{40,}", None),
    (r"sntry[su]_", r"[A-Za-z0-9_=+/-]{40,}", None),
    (r"PMAK-", r"[a-f0-9]{24}-[a-f0-9]{34}", None),
    (r"gl(?:sa|c)_", r"[A-Za-z0-9_+/=]{32,}", None),  # Grafana
    (r"phx_", r"[A-Za-z0-9]{40,}", None),
    (r"figd_", _ANY + "{40,}", None),
    (r"NR[A-Z]{2}-", r"[A-Za-z0-9]{20,}", None),  # New Relic
    (r"pul-", r"[a-f0-9]{40,}", None),  # Pulumi
    (r"pat[A-Za-z0-9]{14}\.", r"[a-f0-9]{64}", None),  # Airtable
    (r"oauth:", r"[a-z0-9]{30}", high_entropy),  # Twitch
    (r"ATBB", r"[A-Za-z0-9_=.-]{28,}", None),  # Bitbucket app password
    (r"pat-(?:na|eu|ap)\d-", r"[a-f0-9]{8}(?:-[a-f0-9]{4}){3}-[a-f0-9]{12}", None),  # HubSpot
    (r"tskey-(?:auth|api|client|scim|webhook)-", r"[A-Za-z0-9-]{20,}", None),  # Tailscale
    (r"AKCp", r"[A-Za-z0-9]{60,}", None),  # JFrog
    (r"pcsk_", r"[A-Za-z0-9_]{40,}", None),  # Pinecone
    (r"fw_", r"[A-Za-z0-9]{20,}", high_entropy),  # Fireworks
    (r"sk_", r"[a-f0-9]{48}", None),  # ElevenLabs
    (
        r"access-(?:sandbox|development|production)-",
        r"[a-f0-9]{8}(?:-[a-f0-9]{4}){3}-[a-f0-9]{12}",
        None,
    ),
    (r"secret_", r"[A-Za-z0-9]{40,}", high_entropy),  # Notion's older keys
    (r"HRKU-", _ANY + "{40,}", None),  # Heroku
    (r"v1\.0-", r"[a-f0-9]{24,}-[a-f0-9]{40,}", None),  # Cloudflare Origin CA
    (r"bot\d{6,12}:", r"AA" + _ANY + "{30,}", None),  # Telegram, in the API URL
    (r"\d{6,12}:", r"AA" + _ANY + "{30,}", None),
    # keys with a format of their own; DER private keys in base64 without PEM armour, by the
    # bytes they start with (PKCS#1 RSA, PKCS#8 plain and encrypted, SEC1 EC, PKCS#12)
    (
        r"MII[A-Za-z0-9+/]{2}(?:AIBAAK|[A-Za-z0-9+/]IBADAN|DB[A-Za-z0-9+/]Bgkqhki|[A-Za-z0-9+/]IBAzCC)",
        r"[A-Za-z0-9+/]{40,}={0,2}",
        None,
    ),
    (r"MHcCAQEE", r"[A-Za-z0-9+/]{40,}={0,2}", None),
    (r"MC4CAQAwBQYDK2Vw", r"[A-Za-z0-9+/]{24,}={0,2}", None),
    (r"b3BlbnNzaC1rZXktdjE", r"[A-Za-z0-9+/]{20,}={0,2}", None),  # OpenSSH's own format
    (r"LS0tLS1CRUdJT", r"[A-Za-z0-9+/]{20,}={0,2}", _private_key_base64),
    (r"AGE-SECRET-KEY-1", r"[0-9A-Z]{50,}", None),
    (r"ED25519-V3:", r"[A-Za-z0-9+/]{86}={0,2}", None),  # Tor onion service key
    (r"eyJ", _ANY + r"{8,}\." + _ANY + r"{8,}\." + _ANY + "*", None),  # JWT, JWS, JWE
    (r"eyJ", r"[A-Za-z0-9+/_-]{16,}={0,2}", _credential_json),  # base64 JSON with credentials
    (
        r"https://hooks\.slack\.com/(?:services|workflows|triggers)/",
        r"[A-Za-z0-9/_-]{20,}",
        None,
    ),
    (
        r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d{5,30}/",
        _ANY + "{30,}",
        None,
    ),
]


def _lead(prefix: str) -> str:
    """The characters a prefix can start with."""
    if prefix.startswith(r"\d"):
        return "0123456789"
    if prefix.startswith("["):
        return prefix[1 : prefix.index("]")]
    return prefix[1] if prefix.startswith("\\") else prefix[0]


_BY_LEAD: dict[str, list[tuple[re.Pattern[str], Check | None]]] = {}
for _prefix, _body, _check in TABLE:
    _compiled = re.compile(rf"(?P<p>{_prefix})(?P<v>{_body})(?![A-Za-z0-9_-])")
    for _ch in _lead(_prefix):
        _BY_LEAD.setdefault(_ch, []).append((_compiled, _check))
# Where a token of 16+ characters starts: every typed token is at least that long.
_TOKEN_START = re.compile(r"(?<![A-Za-z0-9_-])(?=[A-Za-z0-9][A-Za-z0-9_.:/~+=-]{15})")


def redact_prefixed(text: str) -> tuple[str, int]:
    """Replace the body of every token with a known prefix."""
    out: list[str] = []
    pos = count = 0
    for start in _TOKEN_START.finditer(text):
        i = start.start()
        if i < pos:
            continue
        for pattern, check in _BY_LEAD.get(text[i], ()):
            m = pattern.match(text, i)
            if m is not None and (check is None or check(m.group("v"))):
                out += [text[pos : m.start("v")], MARK]
                pos = m.end("v")
                count += 1
                break
    out.append(text[pos:])
    return "".join(out), count


# A token shaped like a provider's, whatever the provider: a short prefix of one to three
# words ending in `_`, `-`, `.` or `:` (`re_`, `tskey-auth-`, `dp.st.prd.`), then 28 or more
# characters that mix upper case, lower case and digits at random. Provider formats come and go
# faster than any table; an identifier or a hash is rarely all three cases at random, and the
# hashes that are (npm's `sha512-` integrity) are named.
_SHAPED = re.compile(
    r"(?<![A-Za-z0-9_.$/+=-])(?P<p>(?:[A-Za-z][A-Za-z0-9]{1,11}[_.:-]){1,3})"
    r"(?P<v>[A-Za-z0-9][A-Za-z0-9_-]{27,})(?![A-Za-z0-9_.+/=-])"
)
_HASH_NAMES = frozenset({"sha1", "sha224", "sha256", "sha384", "sha512", "md5", "blake2b", "sri"})


def _mixed_at_random(body: str) -> bool:
    """Upper case, lower case and digits, at random."""
    return classes(body) >= 3 and random_token(body)


def _shaped(m: re.Match[str]) -> str | None:
    first = re.split(r"[_.:-]", m.group("p"), maxsplit=1)[0].lower()
    if first in _HASH_NAMES or not _mixed_at_random(m.group("v")):
        return None
    return m.group("p") + MARK


redact_shaped: Rule = regex_rule(_SHAPED, _shaped)

# The same body with no prefix at all ("use this one: ...", "ANTHROPIC ..."), from 32
# characters: a word of text that mixes cases and digits at random is a credential far more
# often than anything else a note holds. Not inside a URL or an assignment (other rules read
# those), and not the public things of that shape: Bitcoin addresses, IPFS CIDs, and base64 of
# key material whose secret forms the table knows (an SSH public key's `AAAA...`, DER's `MI...`
# of a certificate or public key: a private one is redacted by its own row first).
_BARE = re.compile(
    r"(?<![A-Za-z0-9_.$/+=:#?&%@~-])(?P<v>[A-Za-z0-9][A-Za-z0-9_-]{31,})(?![\w.+/=-])"
)
_BASE58 = "[1-9A-HJ-NP-Za-km-z]"
_PUBLIC = re.compile(rf"[13]{_BASE58}{{25,34}}|Qm{_BASE58}{{44}}|AAAA[\w-]*|M[A-I][\w-]*")


# Humps of a name (`get`, `User`, `Settings`): most of an identifier, a few letters of a token.
_HUMP = re.compile(r"[A-Z]?[a-z]{2,}")


def _bare(m: re.Match[str]) -> str | None:
    body = m.group("v")
    if _PUBLIC.fullmatch(body) or sum(len(h) for h in _HUMP.findall(body)) >= 0.8 * len(body):
        return None  # getUserAccountSettingsForIdentifierV2Async
    return MARK if _mixed_at_random(body) else None


redact_bare: Rule = regex_rule(_BARE, _bare)


# Tokens whose prefix holds a character no token scan starts over (`$`), or whose prefix is
# itself random: PayPal's access token, Terraform Cloud's (`<14>.atlasv1.<body>`).
_SPLIT_PREFIX = re.compile(
    r"(?<![\w.$-])(?P<p>access_token\$(?:production|sandbox)\$[a-z0-9]{16}\$|[A-Za-z0-9]{14}\.atlasv1\.)"
    r"(?P<v>[A-Za-z0-9_-]{30,})(?![\w-])"
)
redact_split_prefix: Rule = regex_rule(_SPLIT_PREFIX, lambda m: m.group("p") + MARK)

# Mailchimp's key: 32 hex digits and the data centre (`-us12`).
_MAILCHIMP = re.compile(r"(?<![\w-])(?P<v>[a-f0-9]{32})(?P<dc>-us\d{1,2})(?![\w-])")
redact_mailchimp: Rule = regex_rule(_MAILCHIMP, lambda m: MARK + m.group("dc"))

# An Azure AD client secret carries its mark inside: three characters, a digit, `Q~`, 31-34 more.
_AZURE_SECRET = re.compile(r"(?<![\w~.-])(?P<v>[\w~.-]{3}\dQ~[\w~.-]{31,34})(?![\w~.-])")
redact_azure_secret: Rule = regex_rule(_AZURE_SECRET, lambda m: MARK)
