"""API keys for remote embedding providers: where they come from, and keeping them out of text.

A key is held in a :class:`Secret` that prints as ``***``; it is revealed only to build a header.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping

from memd_client.errors import ConfigError

__all__ = ["KEY_VARIABLES", "Secret", "load_api_key", "redact"]

# The environment variables each provider's key is read from, in order.
KEY_VARIABLES: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "voyage": ("VOYAGE_API_KEY",),
    "mistral": ("MISTRAL_API_KEY",),
    "openai-compatible": ("MEMD_EMBEDDING_API_KEY",),
    "ollama": ("MEMD_EMBEDDING_API_KEY",),
}

_MAX_KEY_FILE_BYTES = 64 * 1024
# A key goes into an HTTP header: printable ASCII without spaces, so it can never split a header
# (http.client would put the whole value into its ValueError).
_KEY_CHARS = re.compile(r"[\x21-\x7e]+")
_MASK = "***"
# Token shapes worth masking even when they are not a key memd knows (a server echoing a header).
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)\b(bearer|basic)\s+[^\s\"',;}]+"), r"\1 " + _MASK),
    (
        re.compile(
            r"(?i)\b(authorization|x-goog-api-key|x-api-key|api[-_]?key)(\"?\s*[:=]\s*\"?)[^\s\"',;}]+"
        ),
        r"\1\2" + _MASK,
    ),
    (re.compile(r"\bsk-[^\s\"',;}]+"), _MASK),
    (re.compile(r"\bAIza[0-9A-Za-z_\-]{20,}"), _MASK),
    (re.compile(r"([?&](?:key|api_key|token)=)[^&\s\"']+"), r"\1" + _MASK),
)


class Secret:
    """A string that prints as ``***`` everywhere; :meth:`reveal` it only to build a header."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return _MASK

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return _MASK

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret cannot be pickled")


def load_api_key(provider: str, *, env: Mapping[str, str], key_file: str = "") -> Secret | None:
    """Return the key for ``provider``: from ``key_file`` if one is given, else its variables.

    A key file must be a regular file (not a symlink) owned by the current user with no group or
    other permission bits, as OpenSSH demands of private keys; anything else is a ConfigError.
    """
    if key_file:
        return _read_key_file(os.path.expanduser(key_file))
    for var in KEY_VARIABLES.get(provider, ()):
        value = env.get(var, "").strip()
        if value:
            _check_key(value, var)
            return Secret(value)
    return None


def redact(text: str, secrets: Iterable[Secret | str] = ()) -> str:
    """Replace every known secret value and anything shaped like a token in ``text`` with ***."""
    values = {s.reveal() if isinstance(s, Secret) else s for s in secrets}
    for value in sorted((v for v in values if v), key=len, reverse=True):
        text = text.replace(value, _MASK)
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


def _read_key_file(path: str) -> Secret:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ConfigError(f"API key file {path} does not exist") from None
    except OSError as exc:
        if os.path.islink(path):
            raise ConfigError(
                f"API key file {path} is a symlink; point embedding.api_key_file at the real file"
            ) from None
        raise ConfigError(f"API key file {path} cannot be read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"API key file {path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise ConfigError(
                f"API key file {path} belongs to another user (uid {st.st_uid}); "
                f"copy it to a file of your own and run: chmod 600 {path}"
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"API key file {path} can be read by others (mode {mode:04o}); run: chmod 600 {path}"
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(_MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > _MAX_KEY_FILE_BYTES:
        raise ConfigError(f"API key file {path} is too large to hold a key")
    try:
        value = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"API key file {path} is not UTF-8 text") from None
    if not value:
        raise ConfigError(f"API key file {path} is empty")
    _check_key(value, f"API key file {path}")
    return Secret(value)


def _check_key(value: str, source: str) -> None:
    if not _KEY_CHARS.fullmatch(value):
        # Never quote the value: it is the key.
        raise ConfigError(f"{source} holds a key with spaces, line breaks or non-ASCII characters")
