"""Tests for memd.redact: every secret kind, unchanged ordinary text, line structure, idempotence."""

from __future__ import annotations

import json

import pytest

from memd.redact import MARK, redact, redact_with_count
from memd.redact.names import Tier, tier
from memd.redact.values import random_token

# Fake secrets, assembled from parts so that secret scanners do not flag this file.
R40 = "Xq7Lm2Pz9Rt4Wk8Vb3Nc6Hd1Jf5Gs0Ya2Ue7Io4"  # 40 mixed-class characters
OPENAI = "sk-" + R40 + "T9"
OPENAI_PROJ = "sk-proj-" + R40 + "_Ab-9"
ANTHROPIC = "sk-ant-api03-" + R40 + "Zz"
GOOGLE = "AIza" + "Sy" + R40[:33]
GH_TOKEN = {p: p + R40[:36] for p in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")}
GH_PAT = "github_pat_" + "11ABCDEFG0" + R40[:30] + "_" + R40[:10]
GITLAB = "glpat-" + R40[:20]
SLACK = "xoxb-" + "123456789012-1234567890123-" + R40[:24]
STRIPE = {p: p + R40[:24] for p in ("sk_live_", "rk_live_", "pk_live_", "sk_test_")}
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
HF = "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZaBcDeFgH"
VOYAGE = "pa-" + R40[:32]
JWT = (
    "eyJ"
    + "hbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
PEM_BODY = ["MIIEowIBAAKCAQEA" + R40, R40 + "ab12", "Zm9vYmFy" + R40[:20] + "=="]


def pem(kind: str) -> str:
    label = f"{kind} PRIVATE KEY" if kind != "PGP" else "PGP PRIVATE KEY BLOCK"
    return "\n".join([f"-----BEGIN {label}-----", *PEM_BODY, f"-----END {label}-----"])


# (text, secret that must vanish, text that must remain)
CASES: list[tuple[str, str, str]] = [
    (f"OPENAI_API_KEY={OPENAI}", OPENAI, "OPENAI_API_KEY=sk-" + MARK),
    (f"use {OPENAI_PROJ} here", OPENAI_PROJ, "use sk-proj-" + MARK + " here"),
    (f"key {ANTHROPIC}", ANTHROPIC, "sk-ant-" + MARK),
    (f"maps: {GOOGLE}", GOOGLE, "AIza" + MARK),
    *((f"token {v}", v, p + MARK) for p, v in GH_TOKEN.items()),
    (f"GH={GH_PAT}", GH_PAT, "github_pat_" + MARK),
    (f"git clone with {GITLAB}", GITLAB, "glpat-" + MARK),
    (f"slack bot {SLACK}", SLACK, "xoxb-" + MARK),
    *((f"stripe.api_key = '{v}'", v, p + MARK) for p, v in STRIPE.items()),
    (f"aws id {AWS_ID} ok", AWS_ID, "AKIA" + MARK + " ok"),
    (f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET, "aws_secret_access_key = " + MARK),
    (f"HF_TOKEN: {HF}", HF, "hf_" + MARK),
    (f"voyage {VOYAGE}", VOYAGE, "pa-" + MARK),
    (f"MISTRAL_API_KEY={R40}", R40, "MISTRAL_API_KEY=" + MARK),
    (f"cookie {JWT}", JWT, "eyJ" + MARK),
    (f"Authorization: Bearer {R40}", R40, "Authorization: Bearer " + MARK),
    (f"curl -H 'bearer {R40[:20]}'", R40[:20], "bearer " + MARK + "'"),
    ("Authorization: Basic dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy", "Basic " + MARK),
    ("postgres://app:s3cr3t-pw@db:5432/x", "s3cr3t-pw", "postgres://app:" + MARK + "@db:5432/x"),
    ("password = hunter2", "hunter2", "password = " + MARK),
    ("passwd: letmein", "letmein", "passwd: " + MARK),
    ("pwd=0pen-Sesame", "0pen-Sesame", "pwd=" + MARK),
    ("secret=swordfish", "swordfish", "secret=" + MARK),
    ('api_key: "abc123def456"', "abc123def456", 'api_key: "' + MARK + '"'),
    ("https://x.io/cb?token=abc123xyz&page=2", "abc123xyz", "token=" + MARK + "&page=2"),
    ('"client_secret": "cl-9f8e7d6c",', "cl-9f8e7d6c", '"client_secret": "' + MARK + '",'),
    ("{'access_token': 'at.Zx81-Qq'}", "at.Zx81-Qq", "'access_token': '" + MARK + "'"),
    ("export DB_PASSWORD=CorrectHorse", "CorrectHorse", "export DB_PASSWORD=" + MARK),
    ("PGPASSWORD='pa ss word'", "pa ss word", "PGPASSWORD='" + MARK + "'"),
    ("connect(user='u', password='hunter2')", "hunter2", "password='" + MARK + "')"),
    ("mysql --password=Sup3rS3cret db", "Sup3rS3cret", "--password=" + MARK + " db"),
    ("**Password**: tr0ub4dor&3", "tr0ub4dor&3", "**Password**: " + MARK),
    ("password: hunter2  # dev only", "hunter2", "password: " + MARK + "  # dev only"),
    ("redis://:p4ssw0rd@localhost:6379/0", "p4ssw0rd", "redis://:" + MARK + "@localhost"),
    ("aws_access_key_id = " + AWS_ID, AWS_ID, "aws_access_key_id = AKIA" + MARK),
    ("my password is hunter2!", "hunter2!", "my password is " + MARK),
    (f"the signing key is {R40}.", R40, "key is " + MARK + "."),
    (f"Mistral API key: {R40[:32]}", R40[:32], "API key: " + MARK),
    ("Token: 3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39", "3f2a9c1e8b7d", "Token: " + MARK),
    *((pem(kind), PEM_BODY[0], kind + " PRIVATE KEY") for kind in ("RSA", "EC", "OPENSSH", "PGP")),
    ("-----BEGIN PRIVATE KEY-----\n" + "\n".join(PEM_BODY) + "\n", PEM_BODY[1], "BEGIN PRIVATE"),
]


@pytest.mark.parametrize(("text", "secret", "kept"), CASES)
def test_secret_kinds(text: str, secret: str, kept: str) -> None:
    out, n = redact_with_count(text)
    assert secret not in out
    assert kept in out
    assert n >= 1
    assert out.count("\n") == text.count("\n")
    assert redact(out) == out


def test_pem_block_keeps_every_line() -> None:
    text = "before\n" + pem("RSA") + "\nafter"
    out, n = redact_with_count(text)
    assert out.splitlines() == [
        "before",
        "-----BEGIN RSA PRIVATE KEY-----",
        MARK,
        MARK,
        MARK,
        "-----END RSA PRIVATE KEY-----",
        "after",
    ]
    assert n == 1


def test_unterminated_pem_only_swallows_key_lines() -> None:
    text = "-----BEGIN RSA PRIVATE KEY-----\n" + PEM_BODY[0] + "\n\nNotes continue here."
    assert redact(text) == "-----BEGIN RSA PRIVATE KEY-----\n" + MARK + "\n\nNotes continue here."


def test_pem_inside_json_string_on_one_line() -> None:
    body = "\\n".join(PEM_BODY)
    text = (
        '{"private_key": "-----BEGIN PRIVATE KEY-----\\n' + body + '\\n-----END PRIVATE KEY-----"}'
    )
    out = redact(text)
    assert PEM_BODY[0] not in out and "-----END PRIVATE KEY-----" in out


ORDINARY = """\
# Project notes
The password reset flow sends an email; my password is strong and I never share it.
Use a token budget of 4096 and keep the key points short.
- [x] rotate logs daily, see [the docs](https://example.com/docs/rotation?page=2#top)
def password_reset_handler(request): return redirect("/login")
password_field = forms.CharField(widget=forms.PasswordInput)
token_count = len(tokenizer.encode(text))
def get_secret_name() -> str: return "db-prod"
tok = get_token()
secret = self.secret
password = getpass.getpass()
api_key = os.environ["OPENAI_API_KEY"]
token: str | None = None
token = tokens[0]
OPENAI_API_KEY: ${{ secrets.OPENAI_API_KEY }}
<input type="password" name="password" autocomplete="current-password">
primary_key=True; sort_key: created_at
PWD=/home/alice/projects/memd
DB_PASSWORD=${DB_PASSWORD}
password: <your password here>
Fixed in commit 3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39 after review.
Merged 9fceb02 into main on 2024-05-17T09:30:00Z.
Request id 550e8400-e29b-41d4-a716-446655440000 failed at 12:45:03.
The file lives at /var/lib/memd/workspaces/alice/memory/2024-05-17.md on disk.
See ./docs/SPEC.md and ~/notes/keys.md for details.
Colours: #ff8800, #1E90FF and rgb(12, 34, 56).
It cost $1,234.56 on 2024-05-17 (about 3.5% of the budget).
Token: the unit of text a model reads, roughly four characters.
Secret: nobody knows where the picnic is.
The sort key is lastName, then firstName.
| column | type | note |
|--------|------|------|
| token  | int  | 4096 |
```python
for token in tokens: print(token)
```
我们明天在会议室讨论内存系统的设计和搜索排名。
Die Donaudampfschifffahrtsgesellschaftskapitänswitwenrentenversicherung ist lang.
![diagram](data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==)
Basic authentication is deprecated; use Bearer tokens instead.
The bearer of this letter is a friend.
Keys are rotated every 90 days by the key-management-service-for-production.
ssh git@github.com:org/repo.git and https://user@example.com/path work.
A monkey-patched sk-learn-release-notes-preview page.
if password == expected: return True
The hf_hub_download function and the pa-system are unrelated.
Version 1.2.3-rc.4 shipped; see issue #1234.
I keep the secret recipe for grandma's cake in a drawer.
> Quote: the key to success is consistency.
"""


@pytest.mark.parametrize("line", ORDINARY.splitlines())
def test_ordinary_line_unchanged(line: str) -> None:
    assert redact_with_count(line) == (line, 0)


def test_ordinary_corpus_unchanged() -> None:
    assert len(ORDINARY.splitlines()) >= 40
    assert redact(ORDINARY) == ORDINARY


def test_count_and_line_structure_of_mixed_text() -> None:
    text = f"a\npassword = hunter2\nkey {OPENAI}\n\n{pem('EC')}\nBearer {R40}\nend\n"
    out, n = redact_with_count(text)
    assert n == 4
    assert out.count("\n") == text.count("\n")
    assert redact_with_count(out) == (out, 0)


def test_empty_and_already_redacted() -> None:
    assert redact_with_count("") == ("", 0)
    assert redact_with_count("token=[REDACTED] sk-[REDACTED]") == (
        "token=[REDACTED] sk-[REDACTED]",
        0,
    )


def test_key_inside_assignment_keeps_prefix_once() -> None:
    assert redact(f"token={GH_TOKEN['ghp_']}") == "token=ghp_" + MARK


def test_pathological_inputs_finish() -> None:
    prose = "The quick brown fox jumps over the lazy dog, 42 times. " * 20_000  # ~1 MB
    assert redact(prose) == prose
    for text in (
        "a" * 100_000,
        "password=" + "a" * 100_000,
        'password="' + "a" * 100_000,
        "-----BEGIN " + "A" * 100_000,
        "https://" + "a:" * 50_000,
        "key " * 50_000,
        "sk-" * 50_000,
        "-----BEGIN RSA PRIVATE KEY-----\n" * 2_000,
    ):
        out = redact(text)
        assert out.count("\n") == text.count("\n")


@pytest.mark.parametrize(
    ("name", "before", "level"),
    [
        ("PGPASSWORD", "", Tier.PASSWORD),
        ("dbPass", "", Tier.PASSWORD),
        ("db-password", "", Tier.PASSWORD),
        ("-storepass", "", Tier.PASSWORD),
        ("client_secret", "", Tier.STRONG),
        ("X-Auth-Token", "", Tier.STRONG),
        ("apiKey", "", Tier.STRONG),
        ("Key", "Secret Access ", Tier.STRONG),
        ("GH_PAT", "", Tier.STRONG),
        ("sort_key", "", Tier.ENTROPY),
        ("X-Amz-Signature", "", Tier.ENTROPY),
        ("JSESSIONID", "", Tier.ENTROPY),
        ("token_count", "", Tier.ENTROPY),
        ("keyboard", "", Tier.NONE),
        ("bypass", "", Tier.NONE),
        ("author", "", Tier.NONE),
        ("path", "", Tier.NONE),
    ],
)
def test_names_say_secret_in_any_spelling(name: str, before: str, level: Tier) -> None:
    assert tier(name, before) is level


@pytest.mark.parametrize(
    ("value", "random"),
    [
        ("d842219f97d3582f8fa18d0c01d85e0536fd1de2", True),  # hex
        ("hWeZHoWrEebaKOkdzA+D19ino3fx+4MFgmi/EPfj2j8=", True),  # base64
        ("enew7ep42txpief0wx8szyo66v", True),  # a session id
        ("includeDefaultMemory", False),
        ("memory_index_meta_v1", False),
        ("arn:aws:secretsmanager:eu-west-1:123456789012:secret:db", False),
        ("550e8400-e29b-41d4-a716-446655440000", False),
    ],
)
def test_random_values_are_told_from_names(value: str, random: bool) -> None:
    assert random_token(value) is random


def test_a_value_wrapped_onto_the_next_lines_goes_with_it_and_prose_after_it_stays() -> None:
    text = f"API_KEY={R40}\n{R40[:24]}\n{R40[:12]}\nDone for today.\n"
    assert redact(text) == f"API_KEY={MARK}\n{MARK}\n{MARK}\nDone for today.\n"
    short = "password: hunter2\nREADME2024x\n"  # a short value is not wrapped
    assert redact(short) == f"password: {MARK}\nREADME2024x\n"


def test_a_key_split_across_table_rows_goes_whole() -> None:
    text = f"| name | value |\n|---|---|\n| OpenAI key | {OPENAI[:30]} |\n|  | {R40[:20]} |\n"
    out = redact(text)
    assert R40[:20] not in out and OPENAI[3:30] not in out
    assert out.splitlines()[3] == f"|  | {MARK} |"
    schema = "| column | type |\n|---|---|\n| password | VARCHAR(255) |\n| token | int |\n"
    assert redact(schema) == schema


def test_a_continuation_appended_later_is_redacted_with_its_line() -> None:
    first = f"API_KEY={R40}\n"
    assert redact(first) == f"API_KEY={MARK}\n"
    assert redact(first + R40[:24] + "\n") == f"API_KEY={MARK}\n{MARK}\n"


def test_client_flags_are_read_per_client() -> None:
    assert redact("mysql -uroot -pS3cretPass db") == f"mysql -uroot -p{MARK} db"
    assert redact("redis-cli -a 'S3cret pass' PING") == f"redis-cli -a '{MARK}' PING"
    for ports in ("redis-cli -p 6379 PING", "mysql -P 3306 -u app -p db", "docker run -p 80:80 x"):
        assert redact(ports) == ports


def test_pathological_layouts_finish() -> None:
    for text in (
        "| a " * 50_000,
        ("| key | " + R40 + " |\n") * 2_000,
        (R40 + "\n") * 5_000,
        "mysql " + "-p " * 50_000,
        "x \\\n" * 20_000,
        "key=" * 50_000,
        '{"kty": ' * 20_000,
        "Private-Lines: 9999\n" * 2_000,
        "name: password\n  value:" * 5_000,
    ):
        out = redact(text)
        assert out.count("\n") == text.count("\n")


def test_json_strings_are_redacted_as_the_text_they_encode() -> None:
    """A transcript's JSONL line holds a message's lines as `\\n` escapes and its quotes as `\\"`:
    the redacted line is still one line of valid JSON, and redacting it again changes nothing."""
    content = f'| key | {R40} |\n|  | {R40[:20]} |\nconfig: {{"password": "S3cret!pass"}}'
    line = json.dumps({"type": "message", "message": {"role": "user", "content": content}})
    out = redact(line)
    assert "\n" not in out and R40[:20] not in out and "S3cret!pass" not in out
    assert json.loads(out)["message"]["content"].count("\n") == 2
    assert redact(out) == out
    plain = json.dumps({"question": "When did Caroline go to the support group?", "id": 7})
    assert redact(plain) == plain


def test_a_value_alone_under_its_label_goes() -> None:
    assert redact("Wi-Fi password:\nTr0ub4dor&3\n") == f"Wi-Fi password:\n{MARK}\n"
    for prose in ("Token:\nThe unit a model reads.\n", "Password:\nrequired\n", "Key:\nvalue\n"):
        assert redact(prose) == prose
