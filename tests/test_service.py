"""MemoryService: workspaces, the shared embedding cache, first-search bootstrap, status."""

from __future__ import annotations

from pathlib import Path

import pytest

from memd.config import Config
from memd.embed.fake import FakeEmbedder
from memd.embed.select import Choice
from memd.service import MemoryService
from memd_client.errors import BadRequest, UnknownWorkspace


@pytest.fixture
def fake() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture
def service(config: Config, fake: FakeEmbedder) -> MemoryService:
    svc = MemoryService(config, choice=Choice(fake, "fake", protect=False))
    yield svc  # type: ignore[misc]
    svc.close()


def make_ws(root: Path, text: str) -> Path:
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text(text)
    return root


def test_second_workspace_with_the_same_text_embeds_nothing(
    service: MemoryService, fake: FakeEmbedder, tmp_path: Path
) -> None:
    text = "Shared onboarding notes for every agent.\n" * 40
    a = make_ws(tmp_path / "a", text)
    b = make_ws(tmp_path / "b", text)
    service.registry.add(a)
    service.registry.add(b)
    service.sync(str(a))
    embedded = fake.texts_embedded
    assert embedded > 0
    report = service.sync(str(b))
    assert fake.texts_embedded == embedded
    assert report.cache_hits > 0 and report.pending_files == 0
    assert service.status(str(b))["vectors"] == service.status(str(a))["vectors"]


def test_first_search_indexes_keyword_rows_first(
    service: MemoryService, fake: FakeEmbedder, tmp_path: Path
) -> None:
    ws = make_ws(tmp_path / "w", "The backup runs nightly at 02:00.\n")
    service.registry.add(ws)
    outcome = service.search(str(ws), "when does the backup run")
    assert [h.path for h in outcome.results] == ["MEMORY.md"]
    assert fake.documents_embedded == 0, "the first answer does not wait for embeddings"
    status = service.status(str(ws))
    assert status["files_pending"] == 1 and status["dirty"]
    service.sync(str(ws))
    status = service.status(str(ws))
    assert status["files_pending"] == 0 and not status["dirty"]
    assert status["vectors_match_chunks"] and status["vectors"] == status["chunks"] == 1


def test_workspace_lookup(service: MemoryService, tmp_path: Path) -> None:
    ws = make_ws(tmp_path / "named", "x\n")
    service.registry.add(ws, name="main")
    assert service.registry.get("main").root == ws.resolve()
    assert service.registry.get(str(ws)).name == "main"
    with pytest.raises(UnknownWorkspace):
        service.registry.get("nope")
    with pytest.raises(UnknownWorkspace):
        service.registry.get(str(tmp_path / "missing"))
    with pytest.raises(UnknownWorkspace, match="not a registered workspace"):
        service.registry.get(str(make_ws(tmp_path / "unregistered", "z\n")))
    with pytest.raises(BadRequest):
        service.registry.add(make_ws(tmp_path / "other", "y\n"), name="main")


def test_status_names_the_provider_and_vector_store(service: MemoryService, tmp_path: Path) -> None:
    ws = make_ws(tmp_path / "s", "status check\n")
    service.registry.add(ws)
    service.sync(str(ws))
    st = service.status(str(ws))
    assert st["provider"]["active"] == "fake" and st["provider"]["dims"] == 64
    # by default vectors live in a plain table and are searched through the in-memory sketch
    assert st["vector_store"]["kind"] == "plain" and not st["vector_store"]["sqlite_vec"]
    assert st["identity"]["state"] == "valid"
    assert st["cache_entries"] >= 1


def test_keyword_only_status_says_why(config: Config, tmp_path: Path) -> None:
    svc = MemoryService(config)
    try:
        ws = make_ws(tmp_path / "k", "hello\n")
        svc.registry.add(ws)
        svc.sync(str(ws))
        st = svc.status(str(ws))
        assert st["provider"]["active"] == "none"
        reasons = {s["provider"]: s["reason"] for s in st["provider"]["skipped"]}
        assert "no model configured" in reasons["local"]
    finally:
        svc.close()
