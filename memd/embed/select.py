"""Choose the embedder a configuration asks for, and say why others were passed over."""

from __future__ import annotations

from dataclasses import dataclass, field

from memd.config import EmbeddingConfig
from memd.embed.base import Embedder
from memd.embed.fake import FakeEmbedder

__all__ = ["Choice", "choose_embedder"]


@dataclass
class Choice:
    """The embedder to use (None: keyword-only) and the story of how it was chosen."""

    embedder: Embedder | None
    requested: str
    # True when there is no embedder because a provider is unavailable, not because the
    # configuration asked for keyword-only: an index with vectors is then protected.
    protect: bool
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def reason(self) -> str:
        return "; ".join(f"{name}: {why}" for name, why in self.skipped)


def choose_embedder(config: EmbeddingConfig) -> Choice:
    """Resolve ``[embedding]`` into an embedder.

    ``none`` is keyword-only by choice; ``fake`` is the deterministic test embedder; the local
    and remote providers are not part of this build yet, so asking for them (or ``auto``) gives
    keyword-only search with the reason in status.
    """
    provider = config.provider
    if provider == "none":
        return Choice(
            None, provider, protect=False, skipped=[("none", "keyword-only by configuration")]
        )
    if provider == "fake":
        return Choice(FakeEmbedder(), provider, protect=False)
    skipped: list[tuple[str, str]] = [(provider, "provider not available in this build")]
    return Choice(None, provider, protect=True, skipped=skipped)
