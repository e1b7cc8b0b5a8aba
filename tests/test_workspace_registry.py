"""Registering workspaces: nothing implicit, names that can be used, directories that come later."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import memd_client
from memd.config import Config, WorkspaceConfig
from memd_client.errors import BadRequest, UnknownWorkspace

from .daemon_fixture import running_daemon, wait_for


def make_ws(root: Path, fact: str) -> Path:
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text(f"# Memory\n\n{fact}\n")
    return root


def registry(config: Config) -> list[dict[str, object]]:
    data = json.loads((config.state_dir / "workspaces.json").read_text())
    return list(data["workspaces"])


def test_search_and_get_never_register_a_workspace(tmp_path: Path) -> None:
    ws = make_ws(tmp_path / "stranger", "The staging cluster is called Orion.")
    config = Config.load()
    with running_daemon(config) as daemon, memd_client.connect(daemon.socket_path) as c:
        with pytest.raises(UnknownWorkspace, match="memctl workspace add"):
            c.search(str(ws), "staging cluster")
        with pytest.raises(UnknownWorkspace):
            c.get(str(ws), "MEMORY.md")
        assert c.call("workspace_list")["workspaces"] == []
        c.workspace_add(str(make_ws(tmp_path / "known", "Known.")), name="known")
        assert [e["name"] for e in registry(config)] == ["known"]


@pytest.mark.parametrize(
    ("path", "name", "why"),
    [
        ("/", "", "cannot be a workspace"),
        ("{ws}", " padded", "outer spaces"),
        ("{ws}", "a/b", "'/'"),
        ("{ws}", "..", "'..'"),
        ("{ws}", "x" * 65, "at most 64"),
        ("{ws}", "bell\a", "controls"),
    ],
)
def test_bad_workspaces_and_names_are_refused(
    tmp_path: Path, path: str, name: str, why: str
) -> None:
    ws = make_ws(tmp_path / "ws", "x")
    with running_daemon(Config.load()) as daemon, memd_client.connect(daemon.socket_path) as c:
        with pytest.raises(BadRequest, match=why):
            c.workspace_add(path.format(ws=ws), name=name)
        assert c.status()["workspaces"] == []


def test_a_workspace_missing_at_start_is_kept_and_picked_up_when_it_appears(
    tmp_path: Path,
) -> None:
    """An unmounted drive: memd starts (no exit 3, no restart loop), keeps the workspace
    registered through saves, and opens it once the directory is there."""
    later = tmp_path / "drive" / "agent"
    configured = tmp_path / "drive" / "other"
    config = Config.load(workspaces=(WorkspaceConfig(path=str(configured), name="other"),))
    config.state_dir.mkdir(parents=True, exist_ok=True)
    (config.state_dir / "workspaces.json").write_text(
        json.dumps({"version": 1, "workspaces": [{"path": str(later), "name": "agent"}]})
    )
    with running_daemon(config) as daemon, memd_client.connect(daemon.socket_path) as c:
        st = c.status()
        assert st["daemon"]["missing_workspaces"] == sorted([str(later), str(configured)])
        c.workspace_add(str(make_ws(tmp_path / "present", "Here.")), name="present")
        names = {e["name"] for e in registry(config)}
        assert {"agent", "present"} <= names, "a save must not drop the missing workspace"
        make_ws(later, "The deploy freeze starts on Friday.")

        def picked_up() -> list[dict[str, object]]:
            try:
                return list(c.search("agent", "deploy freeze", mode="keyword")["results"])
            except UnknownWorkspace:
                return []

        found = wait_for(picked_up, "the workspace to be picked up")
        assert found[0]["path"] == "MEMORY.md"
        assert str(later) not in c.status()["daemon"]["missing_workspaces"]
        # A missing entry can always be removed, by name or path.
        assert c.workspace_remove(str(configured))["removed"] is True
        assert c.status()["daemon"]["missing_workspaces"] == []


def test_a_bad_name_in_an_old_registry_falls_back_to_the_directory_name(
    tmp_path: Path,
) -> None:
    ws = make_ws(tmp_path / "agent", "Fact.")
    config = Config.load()
    config.state_dir.mkdir(parents=True, exist_ok=True)
    (config.state_dir / "workspaces.json").write_text(
        json.dumps({"version": 1, "workspaces": [{"path": str(ws), "name": ""}]})
    )
    with running_daemon(config) as daemon, memd_client.connect(daemon.socket_path) as c:
        assert [w["workspace"] for w in c.status()["workspaces"]] == ["agent"]
        assert c.workspace_remove("agent")["removed"] is True
    shutil.rmtree(ws)
    assert not os.path.exists(ws)


def test_partly_indexed_files_and_a_vanished_workspace_are_never_fresh(tmp_path: Path) -> None:
    ws = make_ws(tmp_path / "ws", "The staging cluster is called Orion.")
    config = Config.load(index__max_file_bytes=2000)
    with running_daemon(config) as daemon, memd_client.connect(daemon.socket_path) as c:
        c.workspace_add(str(ws), name="ws")
        c.reindex("ws")
        clean = c.search("ws", "staging", mode="keyword")["freshness"]
        assert clean["fresh"] and clean["skipped_files"] == 0 and clean["problems"] == []
        # Appends that push a daily log past the limit: said at once, and never "fresh"; what
        # was searchable stays so (the head of the log is indexed), and status names the file.
        first = c.append("ws", "A short note about the walrus migration.")
        assert first["note"] is None
        grown = c.append("ws", "x" * 2100)
        assert grown["note"] and "max_file_bytes" in grown["note"]
        c.reindex("ws")
        st = c.status("ws")["workspaces"][0]
        problems = st["freshness"]["problems"]
        assert st["dirty"] and not st["files_skipped"] and st["files_stale"] == 0
        assert any(grown["path"] in p and "2,000" in p for p in problems), problems
        assert not st["freshness"]["fresh"]
        reply = c.search("ws", "walrus migration", mode="keyword")
        assert reply["results"] and reply["results"][0]["path"] == grown["path"]
        assert not reply["freshness"]["fresh"] and reply["freshness"]["problems"]
        # The workspace directory is deleted: its index is still there, but never fresh.
        shutil.rmtree(ws)
        reply = c.search("ws", "staging", mode="keyword")
        assert not reply["freshness"]["fresh"]
        assert any("is gone" in p for p in reply["freshness"]["problems"])
        gone = c.status("ws")["workspaces"][0]
        assert gone["dirty"] and not gone["freshness"]["fresh"]


def test_append_with_the_same_idempotency_key_writes_once(tmp_path: Path) -> None:
    """A client that timed out and retries must not duplicate the entry."""
    ws = make_ws(tmp_path / "ws", "x")
    with running_daemon(Config.load()) as daemon, memd_client.connect(daemon.socket_path) as c:
        c.workspace_add(str(ws), name="ws")
        first = c.append("ws", "Deploys freeze on Fridays.", idempotency_key="k-1")
        again = c.append("ws", "Deploys freeze on Fridays.", idempotency_key="k-1")
        assert again["duplicate"] and again["path"] == first["path"]
        assert (again["start_line"], again["end_line"]) == (first["start_line"], first["end_line"])
        with pytest.raises(BadRequest, match="another text"):
            c.append("ws", "Something else.", idempotency_key="k-1")
        c.append("ws", "Deploys freeze on Fridays.")  # a new key by default: written again
        text = (ws / first["path"]).read_text()
        assert text.count("Deploys freeze on Fridays.") == 2
        with pytest.raises(BadRequest, match="idempotency_key"):
            c.call("append", workspace="ws", text="y", idempotency_key="")


def test_concurrent_appends_all_land_once_and_each_result_points_at_its_text(
    tmp_path: Path,
) -> None:
    """Queued appends of one workspace are written and indexed as one batch: every one lands
    exactly once, each reply's lines hold its own text, and all are searchable at once."""
    import threading

    ws = make_ws(tmp_path / "ws", "x")
    with running_daemon(Config.load()) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(str(ws), name="ws")
        results: dict[int, dict[str, object]] = {}
        errors: list[BaseException] = []

        def writer(i: int) -> None:
            try:
                with memd_client.connect(daemon.socket_path) as own:
                    results[i] = own.append("ws", f"Entry number {i} zebra{i}quux.")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        path = ws / str(results[0]["path"])
        lines = path.read_text().splitlines()
        for i, r in results.items():
            text = "\n".join(lines[int(r["start_line"]) - 1 : int(r["end_line"])])  # type: ignore[call-overload]
            assert f"zebra{i}quux" in text
            assert path.read_text().count(f"zebra{i}quux") == 1
        with memd_client.connect(daemon.socket_path) as c:
            for i in (0, 17, 39):
                hits = c.search("ws", f"zebra{i}quux", mode="keyword")["results"]
                line = int(results[i]["start_line"])  # type: ignore[call-overload]
                assert hits and hits[0]["start_line"] <= line <= hits[0]["end_line"]


def test_a_reloaded_time_zone_reaches_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGHUP's reload applies the time zone at once, to appends too (the writer's config).
    The two zones are 26 hours apart, so their dates always differ."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    ws = make_ws(tmp_path / "ws", "The staging cluster is called Orion.")
    with running_daemon(Config.load(timezone="Etc/GMT+12")) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(str(ws), name="ws")
            before = c.append("ws", "written before the reload")["path"]
            config = tmp_path / "config.toml"
            config.write_text('timezone = "Pacific/Kiritimati"\n')
            monkeypatch.setenv("MEMD_CONFIG", str(config))
            daemon.reload()
            after = c.append("ws", "written after the reload")["path"]
    today = {
        z: datetime.now(ZoneInfo(z)).date().isoformat()
        for z in ("Etc/GMT+12", "Pacific/Kiritimati")
    }
    assert before == f"memory/{today['Etc/GMT+12']}.md"
    assert after == f"memory/{today['Pacific/Kiritimati']}.md"
