"""Secret redaction for text before it is indexed: API keys, tokens, passwords, private keys.

Every replacement keeps line structure (no newline is ever added or removed) and is idempotent.
Secrets are found by family, not by vendor:

- names that say secret (`names.py`, `assign.py`, `flags.py`): a key, variable, flag, header,
  XML tag, table column or row whose words say password, secret, token, credential, API key ...
  in any notation (.env, shell, YAML, JSON, TOML, INI, XML, HTTP, `--flag`, name/value pairs);
  a name that only hints (`key`, `sig`, `salt`, `session`, `token_hash`) needs a random value;
  so does a label of a few words ("API key (don't share): ...", "PAT for Azure DevOps: ...");
- what people keep for themselves (`personal.py`): "password" in some twenty languages
  ("Passwort ist ...", "密码是...", "パスワードは ..."), recovery and backup codes, a wallet's
  seed phrase, a PIN, a payment card's number (Luhn) and security code;
- credentials in URLs and connection strings (`urls.py`): userinfo, a token as the user,
  `.pgpass`; signature and token parameters (`sig=`, `X-Amz-Signature=`) are names that say secret;
- tokens with a known prefix (`prefixes.py`), kept as a table, and tokens shaped like one
  (a short prefix, then 28+ characters of random upper case, lower case and digits), or with
  no prefix from 32 characters (a name's humps, hashes and public keys and addresses kept);
- private keys of every armour (`armour.py`);
- values laid out over lines (`lines.py`): tables, split rows, wrapped values; a value alone
  under its label line is a name that says secret (`assign.py`);
- text inside JSON strings (`escaped.py`): a transcript's JSONL lines hold a message's lines as
  `\\n` escapes; such a string is redacted as the text it encodes, then encoded again.

Choices (tested in tests/test_redact.py and tests/test_redact_corpus.py):
- Typed keys keep their provider prefix (`sk-[REDACTED]`, `ghp_[REDACTED]`, `eyJ[REDACTED]` for
  JWTs); assignments, flags and headers keep the name, scheme and quotes and lose only the value.
- A private key keeps its BEGIN/END lines; each non-blank body line becomes MARK after its lead
  (indentation, `>`, `#`). A BEGIN line without an END only swallows the key-looking lines after it.
- Loose prefixes (`sk-`, `hf_`, `pa-`, `s.`) and hinting names need a high-entropy value: length
  >= 20, Shannon entropy >= 3.5 bits/char, and two character classes (a hyphenated slug is not).
- Prose "is" statements ("my password is strong") are redacted only when the value looks like a
  password: >= 8 chars with a digit or a symbol ("my password is hunter2!" is redacted); so
  are their other turns ("was changed to", "->", "(...)", "pw Hunter22!").
- `key: value` with an unquoted value is redacted only when the value ends the line or looks like
  a password, so Markdown such as "Token: the unit a model reads" stays intact.
- Code is left alone: `token_count = 5`, `password_field = ...`, `password = get_password()`,
  `secret = self.secret`, `pwd = /home/me` (paths), `None`/`true`/type names, `${VAR}` placeholders,
  `{ email, password: hashedPassword }`; a client's port flag (`redis-cli -p 6379`) is not a password.
- Base64 that is not in a key-like context (e.g. a `data:image/png;base64,...` URI) is kept.
"""

from memd.redact.base import MARK
from memd.redact.engine import reads_whole_text, redact, redact_with_count, starts_block

__all__ = ["MARK", "reads_whole_text", "redact", "redact_with_count", "starts_block"]
