"""The provider chain: local, then remote providers with keys, then keyword-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from memd.config import EmbeddingConfig
from memd.embed.select import choose_embedder

from .gguf_fixture import bert_header, needs_llama


def test_auto_with_nothing_is_keyword_only_and_protective(tmp_path: Path) -> None:
    choice = choose_embedder(EmbeddingConfig(), models_dir=tmp_path / "models", env={})
    assert choice.embedder is None and choice.protect
    names = [name for name, _ in choice.skipped]
    assert names == ["local", "openai", "gemini", "voyage", "mistral"]
    assert "no model configured" in choice.skipped[0][1]
    assert "OPENAI_API_KEY" in choice.skipped[1][1]


def test_none_is_a_choice_not_an_outage() -> None:
    choice = choose_embedder(EmbeddingConfig(provider="none"), env={})
    assert choice.embedder is None and not choice.protect


@needs_llama
def test_local_model_found_in_the_model_directory(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    bert_header(models / "tiny.gguf", dims=12)
    choice = choose_embedder(EmbeddingConfig(), models_dir=models, env={})
    assert choice.embedder is not None
    assert (choice.embedder.provider, choice.embedder.dims) == ("local", 12)


@needs_llama
def test_broken_local_model_falls_through_to_a_remote_with_a_key(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a model")
    config = EmbeddingConfig(model_path=str(bad))
    choice = choose_embedder(config, env={"OPENAI_API_KEY": "sk-test-not-real"})
    assert choice.embedder is not None and choice.embedder.provider == "openai"
    assert choice.skipped[0][0] == "local" and "GGUF" in choice.skipped[0][1]
    assert "sk-test-not-real" not in repr(choice.embedder) + str(choice.embedder.settings())


def test_explicit_provider_with_fallback(tmp_path: Path) -> None:
    config = EmbeddingConfig(provider="gemini", fallback="fake")
    choice = choose_embedder(config, env={})
    assert choice.embedder is not None and choice.embedder.provider == "fake"
    assert choice.skipped[0][0] == "gemini"


def test_explicit_provider_without_key_protects_the_index() -> None:
    choice = choose_embedder(EmbeddingConfig(provider="voyage"), env={})
    assert choice.embedder is None and choice.protect
    assert "VOYAGE_API_KEY" in choice.reason


@needs_llama
def test_memd_local_model_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from memd.config import Config

    model = bert_header(tmp_path / "m.gguf")
    monkeypatch.setenv("MEMD_LOCAL_MODEL", str(model))
    config = Config.load()
    choice = choose_embedder(config.embedding, models_dir=config.dirs.models, env={})
    assert choice.embedder is not None and choice.embedder.provider == "local"
