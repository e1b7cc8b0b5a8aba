"""Choose the embedder a configuration asks for, and say why others were passed over.

The automatic chain is: the local GGUF model (when one is configured or present in the model
directory), then the remote providers that have an API key, in the order OpenAI, Gemini, Voyage,
Mistral; then keyword-only search. Ollama and other OpenAI-compatible servers are used only when
named explicitly.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from memd.config import EmbeddingConfig
from memd.dist import install_hint
from memd.embed.base import Embedder
from memd.embed.fake import FakeEmbedder
from memd_client.errors import ConfigError, ProviderUnavailable

if TYPE_CHECKING:
    from memd.embed.process import ProcessEmbedder

__all__ = ["REMOTE_ORDER", "Choice", "choose_embedder", "missing_model"]

REMOTE_ORDER = ("openai", "gemini", "voyage", "mistral")
MODE_MEMORY = "local-model-modes.json"
"""In the state directory: the llama.cpp load mode that works per model file and CPU."""


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

    def unmet(self, config: EmbeddingConfig) -> bool:
        """No embedder although the configuration named one (a provider, or a model file):
        worth a warning, where keyword-only by choice or for want of any model is not."""
        named = self.requested not in ("auto", "none") or bool(config.model_path)
        return self.embedder is None and self.protect and named


def missing_model(path: Path) -> str:
    """Why ``path`` names no model: a relative path is read from the working directory of the
    process that reads it, which for the daemon a service manager sets (often /), so it says
    which directory that was."""
    where = "" if path.is_absolute() else f" (looked for in {Path.cwd()})"
    return f"model file {path} does not exist{where}"


def choose_embedder(
    config: EmbeddingConfig,
    *,
    models_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    state_dir: Path | None = None,
    probe: bool = False,
) -> Choice:
    """Resolve ``[embedding]`` into an embedder (or keyword-only, with the reasons).

    Args:
        state_dir: where the local provider remembers which load mode works on this CPU.
        probe: start the local model's worker and embed one text before choosing it, so a
            model that crashes or will not load passes the choice on down the chain.
    """
    env = os.environ if env is None else env
    requested = config.provider
    if requested == "none":
        return Choice(
            None, requested, protect=False, skipped=[("none", "keyword-only by configuration")]
        )
    if requested == "fake":
        return Choice(FakeEmbedder(), requested, protect=False)
    skipped: list[tuple[str, str]] = []
    if requested == "auto":
        candidates = ["local", *REMOTE_ORDER]
    else:
        candidates = [requested]
        if config.fallback not in ("none", requested):
            candidates.append(config.fallback)
    for name in candidates:
        embedder = _create(name, config, models_dir, env, skipped, state_dir, probe)
        if embedder is not None:
            return Choice(embedder, requested, protect=False, skipped=skipped)
    return Choice(None, requested, protect=True, skipped=skipped)


def _create(
    name: str,
    config: EmbeddingConfig,
    models_dir: Path | None,
    env: Mapping[str, str],
    skipped: list[tuple[str, str]],
    state_dir: Path | None = None,
    probe: bool = False,
) -> Embedder | None:
    try:
        if name == "fake":
            return FakeEmbedder()
        if name == "local":
            local = _local(config, models_dir, skipped, state_dir)
            if local is not None and probe:
                try:
                    local.probe()
                except BaseException:
                    local.close()
                    raise
            return local
        from memd.embed.providers import create_remote

        return create_remote(name, config, env)
    except (ProviderUnavailable, ConfigError) as exc:
        skipped.append((name, str(exc)))
        return None


def _local(
    config: EmbeddingConfig,
    models_dir: Path | None,
    skipped: list[tuple[str, str]],
    state_dir: Path | None,
) -> ProcessEmbedder | None:
    path: Path | None = Path(config.model_path).expanduser() if config.model_path else None
    if path is None and models_dir is not None:
        from memd.embed.models import find_default_model

        path = find_default_model(models_dir)
    if path is None:
        where = f" and none in {models_dir}" if models_dir else ""
        skipped.append(
            ("local", f"no model configured (embedding.model_path or MEMD_LOCAL_MODEL){where}")
        )
        return None
    if not path.is_file():
        raise ProviderUnavailable(missing_model(path))
    if importlib.util.find_spec("llama_cpp") is None:
        raise ProviderUnavailable(f"llama-cpp-python is not installed: {install_hint('local')}")
    from memd.embed.load_modes import ModeMemory
    from memd.embed.process import ProcessEmbedder

    return ProcessEmbedder(
        path,
        threads=config.threads,
        batch_size=config.batch_size,
        query_prefix=config.query_prefix or None,
        document_prefix=config.document_prefix or None,
        memory=ModeMemory(state_dir / MODE_MEMORY) if state_dir else None,
        timeout=config.timeout_seconds,
    )
