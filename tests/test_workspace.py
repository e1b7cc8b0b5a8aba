"""Discovery of memory files on real files in tmp_path (no mocks)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

from memd.markdown.discover import classify, daily_date, discover, is_ignored, resolve_extra_paths


def write(path: Path, text: str = "x\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def rels(root: Path, *extra: str, **kw: int) -> list[str]:
    return [f.rel for f in discover(root, extra, **kw).files]


@pytest.fixture()
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    write(root / "MEMORY.md", "# long term\n")
    write(root / "memory" / "2026-03-01.md")
    write(root / "memory" / "topic.md")
    write(root / "memory" / "sub" / "deep" / "2025-12-31-standup.md")
    write(root / "SOUL.md")  # not a memory file
    write(root / "notes" / "a.md")
    return root


def test_basic_discovery_sorted_with_kinds(ws: Path) -> None:
    d = discover(ws)
    assert d.complete and d.skipped == []
    assert [f.rel for f in d.files] == [
        "MEMORY.md",
        "memory/2026-03-01.md",
        "memory/sub/deep/2025-12-31-standup.md",
        "memory/topic.md",
    ]
    by = {f.rel: f for f in d.files}
    assert by["MEMORY.md"].kind == "evergreen" and by["MEMORY.md"].day is None
    assert by["memory/2026-03-01.md"].kind == "daily"
    assert by["memory/2026-03-01.md"].day == datetime.date(2026, 3, 1)
    assert by["memory/sub/deep/2025-12-31-standup.md"].day == datetime.date(2025, 12, 31)
    assert by["memory/topic.md"].kind == "topic"
    f = by["MEMORY.md"]
    assert f.abs == ws / "MEMORY.md" and f.abs.is_absolute()
    st = os.stat(f.abs)
    assert (f.size, f.mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_legacy_lowercase_memory_md(tmp_path: Path) -> None:
    write(tmp_path / "memory.md")
    d = discover(tmp_path)
    assert [(f.rel, f.kind) for f in d.files] == [("memory.md", "evergreen")]


def test_empty_and_missing_workspace(tmp_path: Path) -> None:
    assert discover(tmp_path) == discover(tmp_path)
    d = discover(tmp_path)
    assert d.files == [] and d.complete
    gone = discover(tmp_path / "nope")
    assert gone.files == [] and not gone.complete  # callers must not prune a vanished workspace


def test_symlinked_memory_md_skipped(tmp_path: Path) -> None:
    real = write(tmp_path / "elsewhere.md")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "MEMORY.md").symlink_to(real)
    (ws / "memory.md").symlink_to(real)
    assert rels(ws) == []


def test_memory_md_directory_is_not_a_file(tmp_path: Path) -> None:
    (tmp_path / "MEMORY.md").mkdir()
    write(tmp_path / "MEMORY.md" / "inner.md")
    assert rels(tmp_path) == []


def test_symlinked_memory_dir_skipped(tmp_path: Path) -> None:
    real = tmp_path / "real"
    write(real / "a.md")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "memory").symlink_to(real, target_is_directory=True)
    assert rels(ws) == []


def test_memory_as_a_file_is_ignored(tmp_path: Path) -> None:
    write(tmp_path / "memory", "not a dir")
    assert rels(tmp_path) == []


def test_symlinks_inside_memory_skipped(ws: Path, tmp_path: Path) -> None:
    outside = write(tmp_path / "outside" / "secret.md")
    (ws / "memory" / "link.md").symlink_to(outside)
    (ws / "memory" / "inlink.md").symlink_to(ws / "memory" / "topic.md")
    (ws / "memory" / "dirlink").symlink_to(tmp_path / "outside", target_is_directory=True)
    (ws / "memory" / "dangling.md").symlink_to(tmp_path / "nothing.md")
    got = rels(ws)
    assert not any("link" in r or "dangling" in r for r in got)
    assert "memory/topic.md" in got


def test_only_lowercase_md_regular_files(ws: Path) -> None:
    write(ws / "memory" / "notes.txt")
    write(ws / "memory" / "UPPER.MD")
    write(ws / "memory" / "mixed.Md")
    write(ws / "memory" / "noext")
    write(ws / "memory" / "archive.md.bak")
    (ws / "memory" / "dir.md").mkdir()
    write(ws / "memory" / "dir.md" / "inside.md")
    os.mkfifo(ws / "memory" / "fifo.md")
    got = rels(ws)
    assert "memory/dir.md/inside.md" in got
    assert not {"memory/notes.txt", "memory/UPPER.MD", "memory/mixed.Md", "memory/fifo.md"} & set(
        got
    )
    assert "memory/dir.md" not in got


def test_hidden_dirs_are_walked(ws: Path) -> None:
    write(ws / "memory" / ".dreams" / "state.json")
    write(ws / "memory" / ".dreams" / "note.md")
    assert "memory/.dreams/note.md" in rels(ws)


@pytest.mark.parametrize(
    "name",
    [
        ".git",
        "node_modules",
        ".pnpm-store",
        ".venv",
        "venv",
        ".tox",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".idea",
        ".vscode",
        ".cache",
        "Node_Modules",
        ".GIT",
    ],
)
def test_ignored_directories(ws: Path, name: str) -> None:
    write(ws / "memory" / name / "x.md")
    write(ws / "memory" / "a" / name / "b" / "y.md")
    got = rels(ws)
    assert not any(name in r for r in got)


@pytest.mark.parametrize(
    "name",
    [
        "x.md.swp",
        ".x.md.swp",
        ".x.md.swo",
        ".x.md.swx",
        "x.md~",
        ".#x.md",
        "4913",
        ".goutputstream-ABC123",
        "x.md.tmp",
        ".x.md.tmp-1234",
        ".#lock.md",
        "X.SWP",
    ],
)
def test_editor_temp_names(ws: Path, name: str) -> None:
    write(ws / "memory" / name)
    assert is_ignored(name)
    assert f"memory/{name}" not in rels(ws)


def test_is_ignored_rules() -> None:
    assert is_ignored("memory/node_modules/x.md")
    assert is_ignored("a/.GIT/b.md")
    assert is_ignored("memory\\.venv\\x.md")
    assert not is_ignored("memory/x.md")
    assert not is_ignored("memory/.dreams/x.md")
    assert not is_ignored("memory/venvy/x.md")
    assert not is_ignored("memory")
    assert not is_ignored("")
    assert not is_ignored("memory/4913.md")
    assert not is_ignored("memory/tmp.md")


def test_size_cap_skipped_with_reason(ws: Path) -> None:
    write(ws / "memory" / "big.md", "y" * 2000)
    write(ws / "memory" / "edge.md", "z" * 1000)
    d = discover(ws, max_file_bytes=1000)
    got = [f.rel for f in d.files]
    assert "memory/big.md" not in got and "memory/edge.md" in got
    assert ("memory/big.md", "larger than 1000 bytes (2000)") in d.skipped
    assert d.complete


def test_default_size_cap_reason_text(tmp_path: Path) -> None:
    big = tmp_path / "MEMORY.md"
    with open(big, "wb") as f:
        f.truncate(10 * 1024 * 1024 + 1)  # sparse: cheap
    d = discover(tmp_path)
    assert d.files == []
    assert d.skipped == [("MEMORY.md", "larger than 10485760 bytes (10485761)")]


def test_extra_paths(ws: Path, tmp_path: Path) -> None:
    write(tmp_path / "outside" / "o.md")
    write(tmp_path / "outside" / "sub" / "p.md")
    write(tmp_path / "outside" / "skip.txt")
    write(tmp_path / "single.md")
    write(tmp_path / "single.txt")
    target = write(tmp_path / "target.md")
    (tmp_path / "linked.md").symlink_to(target)
    (tmp_path / "linkdir").symlink_to(tmp_path / "outside", target_is_directory=True)
    d = discover(
        ws,
        [
            "notes",  # relative, inside
            str(tmp_path / "outside"),  # absolute dir
            "  ../single.md  ",  # relative file outside, trimmed
            "../single.txt",  # not .md
            "",
            "   ",
            "../missing-dir",
            "../missing.md",
            str(tmp_path / "linked.md"),  # symlinked file
            str(tmp_path / "linkdir"),  # symlinked dir
        ],
    )
    by = {f.rel: f for f in d.files}
    assert set(by) == {
        "MEMORY.md",
        "memory/2026-03-01.md",
        "memory/sub/deep/2025-12-31-standup.md",
        "memory/topic.md",
        "notes/a.md",
        "../outside/o.md",
        "../outside/sub/p.md",
        "../single.md",
    }
    assert by["../outside/o.md"].kind == "extra" and by["../outside/o.md"].day is None
    assert by["notes/a.md"].kind == "extra"
    assert by["../single.md"].abs == tmp_path / "single.md"
    assert d.complete and d.skipped == []


def test_extra_daily_named_file_is_extra(tmp_path: Path) -> None:
    write(tmp_path / "log" / "2026-01-02.md")
    d = discover(tmp_path, ["log"])
    assert [(f.rel, f.kind, f.day) for f in d.files] == [("log/2026-01-02.md", "extra", None)]


def test_extra_tilde_expansion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    write(home / "notes" / "h.md")
    monkeypatch.setenv("HOME", str(home))
    ws = tmp_path / "ws"
    ws.mkdir()
    assert rels(ws, "~/notes") == ["../home/notes/h.md"]
    assert resolve_extra_paths(ws, ["~/notes", str(home / "notes"), "~/notes/"]) == [home / "notes"]


def test_extra_pointing_at_memory_does_not_duplicate(ws: Path) -> None:
    plain = rels(ws)
    assert rels(ws, "memory", str(ws / "memory"), "./memory/", "memory/topic.md", "MEMORY.md") == (
        plain
    )
    d = discover(ws, ["."])
    assert [f.rel for f in d.files] == sorted(plain + ["SOUL.md", "notes/a.md"])
    assert {f.rel: f.kind for f in d.files}["memory/topic.md"] == "topic"


def test_duplicates_by_realpath_first_wins(ws: Path, tmp_path: Path) -> None:
    # The same directory reached by two spellings, one through a symlinked parent.
    (tmp_path / "alias").symlink_to(ws, target_is_directory=True)
    d = discover(ws, [str(tmp_path / "alias" / "memory"), "memory"])
    got = [f.rel for f in d.files]
    assert len(got) == len(set(got)) == 4
    assert not any(r.startswith("..") for r in got)
    # Kinds stay those of the canonical memory/ walk.
    assert {f.kind for f in d.files} == {"evergreen", "daily", "topic"}


def test_extra_dir_walk_applies_ignore_rules(tmp_path: Path) -> None:
    write(tmp_path / "notes" / "ok.md")
    write(tmp_path / "notes" / ".git" / "x.md")
    write(tmp_path / "notes" / "x.md.swp")
    write(tmp_path / "notes" / ".#x.md")
    (tmp_path / "notes" / "l.md").symlink_to(tmp_path / "notes" / "ok.md")
    assert rels(tmp_path, "notes") == ["notes/ok.md"]


@pytest.mark.parametrize("spelling", ["absolute", "relative", "dotted"])
def test_paths_are_relative_to_the_root_however_it_is_spelt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    """Paths under the root are cut from the walk's own; the others (an extra path outside, a
    root spelt with ``..``) go through relpath. Both must give what relpath gives."""
    ws = tmp_path / "ws"
    for rel in ("MEMORY.md", "memory/2026-04-01.md", "memory/a b/c é.md", "memory/x/y/z.md"):
        write(ws / rel)
    write(tmp_path / "outside" / "o.md")
    monkeypatch.chdir(tmp_path)
    root = {"absolute": ws, "relative": Path("ws"), "dotted": Path("ws/../ws")}[spelling]
    d = discover(root, ["../outside", "memory/x"])
    found = {f.rel: f.abs for f in d.files}
    assert set(found) == {
        "MEMORY.md",
        "memory/2026-04-01.md",
        "memory/a b/c é.md",
        "memory/x/y/z.md",
        "../outside/o.md",
    }
    for rel, path in found.items():
        assert rel == os.path.relpath(path, root)


def test_removed_file_is_gone_on_rescan(tmp_path: Path) -> None:
    f = write(tmp_path / "memory" / "a.md")
    assert rels(tmp_path) == ["memory/a.md"]
    f.unlink()
    d = discover(tmp_path)
    assert d.files == [] and d.complete


def skip_if_permissions_bypassed(tmp_path: Path) -> None:
    """Root (with CAP_DAC_OVERRIDE) reads anything; probe rather than trust os.geteuid() alone."""
    probe = tmp_path / "probe"
    probe.mkdir()
    probe.chmod(0)
    try:
        os.listdir(probe)
    except PermissionError:
        return
    finally:
        probe.chmod(0o755)
    pytest.skip(f"euid {os.geteuid()} can read a mode-0 directory")


def test_unlistable_directory_marks_incomplete(
    ws: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    skip_if_permissions_bypassed(tmp_path)
    locked = ws / "memory" / "locked"
    write(locked / "x.md")
    locked.chmod(0)
    try:
        d = discover(ws)
    finally:
        locked.chmod(0o755)
    assert not d.complete
    assert "memory/locked/x.md" not in [f.rel for f in d.files]
    assert "memory/topic.md" in [f.rel for f in d.files]
    assert any(r == "memory/locked/" for r, _ in d.skipped)
    assert sum("cannot list" in r.getMessage() for r in caplog.records) == 1


def test_unreadable_file_skipped(ws: Path, tmp_path: Path) -> None:
    skip_if_permissions_bypassed(tmp_path)
    f = write(ws / "memory" / "secret.md")
    f.chmod(0)
    try:
        d = discover(ws)
    finally:
        f.chmod(0o644)
    assert ("memory/secret.md", "unreadable: permission denied") in d.skipped
    assert d.complete


@pytest.mark.parametrize(
    ("rel", "kind", "day"),
    [
        ("MEMORY.md", "evergreen", None),
        ("memory.md", "evergreen", None),
        ("./MEMORY.md", "evergreen", None),
        ("Memory.md", "extra", None),
        ("DREAMS.md", "evergreen", None),  # the dream diary, searchable like MEMORY.md
        ("memory/2026-03-01.md", "daily", datetime.date(2026, 3, 1)),
        ("./memory/2026-03-01.md", "daily", datetime.date(2026, 3, 1)),
        ("memory/2024-02-29.md", "daily", datetime.date(2024, 2, 29)),
        ("memory/2023-02-29.md", "topic", None),
        ("memory/2023-02-30.md", "topic", None),
        ("memory/2023-13-01.md", "topic", None),
        ("memory/0000-01-01.md", "topic", None),
        ("memory/2023-1-01.md", "topic", None),
        ("memory/20230101.md", "topic", None),
        ("memory/2023-01-01-.md", "topic", None),
        ("memory/2023-01-01-standup.md", "daily", datetime.date(2023, 1, 1)),
        ("memory/2023-01-01-a-b.c.md", "daily", datetime.date(2023, 1, 1)),
        ("memory/2023-01-01_x.md", "topic", None),
        ("memory/x-2023-01-01.md", "topic", None),
        ("memory/2023-01-01.MD", "topic", None),
        ("memory/2023-01-01.md.bak", "topic", None),
        ("memory/a/b/2023-01-01.md", "daily", datetime.date(2023, 1, 1)),
        ("memory/2023-01-01/notes.md", "topic", None),
        ("memory/\u0662\u0660\u0662\u0663-01-01.md", "topic", None),  # Arabic-Indic digits
        ("memory/topic.md", "topic", None),
        ("notes/2023-01-01.md", "extra", None),
        ("../x/2023-01-01.md", "extra", None),
        ("2023-01-01.md", "extra", None),
    ],
)
def test_classify(rel: str, kind: str, day: datetime.date | None) -> None:
    assert classify(rel) == (kind, day)
    assert daily_date(rel) == day
