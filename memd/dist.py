"""The distribution memd is published as, and the install commands that name it.

The commands are ``memd`` and ``memctl``, but "memd" and "memctl" on PyPI are other people's
projects: a hint must name this distribution, and say what works from a checkout too.
"""

from __future__ import annotations

__all__ = ["DISTRIBUTION", "install_hint"]

DISTRIBUTION = "memd-agent"


def install_hint(extra: str | None = None) -> str:
    """How to install memd, or its optional part ``extra`` (``local``, ``mcp``): from PyPI,
    or from a checkout of memd's repository."""
    if extra is None:
        return f"pipx install {DISTRIBUTION} (from a checkout of memd: pip install -e .)"
    return (
        f"pip install '{DISTRIBUTION}[{extra}]' (from a checkout of memd: "
        f"pip install -e '.[{extra}]')"
    )
