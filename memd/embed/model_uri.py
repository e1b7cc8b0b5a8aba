"""Model URIs: ``hf:ORG/REPO/FILE.gguf[@REVISION]`` or an https URL, optionally ``#sha256=HEX``."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from memd.embed.http import is_loopback
from memd_client.errors import ConfigError

__all__ = ["ModelSource", "resolve_uri"]

_SHA256 = re.compile(r"[0-9a-f]{64}")
_HF_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HF_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: the URL to fetch, the local file name, its sha256 if known."""

    url: str
    filename: str
    sha256: str | None = None


def resolve_uri(uri: str) -> ModelSource:
    """Parse a model URI into the URL to fetch, the local file name and the expected sha256.

    ``hf:ORG/REPO/FILE.gguf@REVISION`` maps to Hugging Face's resolve URL (revision ``main`` by
    default); an https URL is taken as is; either may end in ``#sha256=HEX``.
    """
    text, _, fragment = uri.strip().partition("#")
    sha = _fragment_sha256(fragment, uri) if fragment else None
    if text.startswith("hf:"):
        url, filename = _resolve_hf(text[3:], uri)
    else:
        url, filename = _resolve_url(text, uri)
    return ModelSource(url, filename, sha)


def _bad(uri: str, why: str) -> ConfigError:
    return ConfigError(f"bad model URI {uri!r}: {why}")


def _fragment_sha256(fragment: str, uri: str) -> str:
    key, _, value = fragment.partition("=")
    if key.lower() != "sha256" or not _SHA256.fullmatch(value.lower()):
        raise _bad(uri, "the only fragment accepted is #sha256=<64 hex digits>")
    return value.lower()


def _resolve_hf(rest: str, uri: str) -> tuple[str, str]:
    path, _, revision = rest.rpartition("@") if "@" in rest else (rest, "", "main")
    if path.count("/") < 2:
        raise _bad(uri, "expected hf:ORG/REPO/FILE.gguf[@REVISION]")
    org, repo, *file_parts = path.split("/")
    for name in (org, repo):
        if not _HF_NAME.fullmatch(name):
            raise _bad(uri, f"{name!r} is not a Hugging Face organisation or repository name")
    if any(part in ("", ".", "..") or "\\" in part for part in file_parts):
        raise _bad(uri, "the file path inside the repository is malformed")
    if not _HF_REVISION.fullmatch(revision) or ".." in revision:
        raise _bad(uri, f"{revision!r} is not a revision (a branch, tag or commit)")
    filename = _check_filename(file_parts[-1], uri)
    quoted = "/".join(urllib.parse.quote(part) for part in file_parts)
    rev = urllib.parse.quote(revision, safe="")
    return f"https://huggingface.co/{org}/{repo}/resolve/{rev}/{quoted}", filename


def _resolve_url(text: str, uri: str) -> tuple[str, str]:
    try:
        parts = urllib.parse.urlsplit(text)
        host = parts.hostname
        parts.port  # noqa: B018 -- raises ValueError on a malformed port
    except ValueError as exc:
        raise _bad(uri, str(exc)) from exc
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http") or not host:
        raise _bad(uri, "expected hf:ORG/REPO/FILE.gguf or an https:// URL")
    if scheme == "http" and not is_loopback(host):
        raise _bad(uri, "plain http is refused (only loopback hosts may use it); use https")
    segments = parts.path.split("/")
    filename = _check_filename(urllib.parse.unquote(segments[-1]), uri)
    # A pasted Hugging Face page link (/blob/) serves HTML; the file itself is under /resolve/.
    if host == "huggingface.co" and len(segments) > 4 and segments[3] == "blob":
        segments[3] = "resolve"
    path = "/".join(segments)
    return urllib.parse.urlunsplit((scheme, parts.netloc, path, parts.query, "")), filename


def _check_filename(name: str, uri: str) -> str:
    if not name or any(sep in name for sep in ("/", "\\", "\0")) or name.startswith("."):
        raise _bad(uri, f"{name!r} cannot be a file name in the model directory")
    if not name.lower().endswith(".gguf"):
        raise _bad(uri, f"{name!r} is not a .gguf file")
    return name
