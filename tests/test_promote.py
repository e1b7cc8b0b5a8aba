"""Promotion into MEMORY.md: rehydration, the section format, idempotence, the size budget, and
concurrent human edits (real files, real threads)."""

from __future__ import annotations

import logging
import os
import random
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import date
from pathlib import Path

import pytest

from memd.dreams import promote, sharedfile
from memd.dreams.promote import PromotionResult, apply_promotions, rehydrate
from memd.dreams.ranking import Candidate
from memd.dreams.recall_entry import RecallEntry
from memd_client.errors import PathRefused

DAY = date(2024, 5, 2)
NOTE = "memory/2024-05-01.md"
DAILY = (
    "# 2024-05-01\n"
    "\n"
    "Deploys use blue/green with a ten minute bake.\n"
    "Rollback is a DNS flip.\n"
    "\n"
    "Lunch was fine.\n"
)
SNIPPET = "Deploys use blue/green with a ten minute bake. Rollback is a DNS flip."


def _entry(
    path: str = NOTE, start: int = 3, end: int = 4, snippet: str = SNIPPET, key: str = ""
) -> RecallEntry:
    return RecallEntry(
        key=key or f"memory:{path}:{start}:{end}",
        path=path,
        start_line=start,
        end_line=end,
        snippet=snippet,
        recall_count=4,
        daily_count=1,
        total_score=4.1,
    )


def _cand(entry: RecallEntry, score: float = 0.8766) -> Candidate:
    return Candidate(entry, score, {}, 5, 3, 1.0)


def _note(ws: Path, text: str = DAILY, rel: str = NOTE) -> Path:
    path = ws / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _bullet(key: str, text: str, src: str) -> str:
    return (
        f"<!-- memd-promotion:{key} -->\n- {text} [score=0.877 recalls=4 avg=0.820 source={src}]\n"
    )


SECTION = "\n## Promoted From Short-Term Memory (2024-05-02)\n\n" + _bullet(
    f"memory:{NOTE}:3:4", SNIPPET, f"{NOTE}:3-4"
)


# --- rehydration -----------------------------------------------------------------------------


def test_rehydrate_unchanged_lines_are_kept(workspace: Path) -> None:
    _note(workspace)
    got = rehydrate(workspace, _entry())
    assert got == (3, 4, "Deploys use blue/green with a ten minute bake.\nRollback is a DNS flip.")


def test_rehydrate_follows_lines_moved_down(workspace: Path) -> None:
    _note(workspace, "intro\n\nmore\nand more\n\n" + DAILY)
    assert rehydrate(workspace, _entry())[:2] == (8, 9)


def test_rehydrate_prefers_the_copy_nearest_the_old_lines(workspace: Path) -> None:
    body = "Rollback is a DNS flip.\n" + "filler\n" * 20 + "Rollback is a DNS flip.\n"
    _note(workspace, body)
    entry = _entry(start=20, end=20, snippet="Rollback is a DNS flip.")
    assert rehydrate(workspace, entry) == (22, 22, "Rollback is a DNS flip.")


def test_rehydrate_finds_a_reflowed_snippet(workspace: Path) -> None:
    _note(
        workspace, "x\nDeploys use blue/green\nwith a ten minute bake. Rollback\nis a DNS flip.\n"
    )
    assert rehydrate(workspace, _entry())[:2] == (2, 4)


def test_rehydrate_edited_beyond_recognition_is_refused(workspace: Path) -> None:
    _note(workspace, "# 2024-05-01\n\nWe now deploy with canaries only.\nNo more DNS tricks.\n")
    assert isinstance(rehydrate(workspace, _entry()), str)


def test_rehydrate_missing_file_is_refused(workspace: Path) -> None:
    assert "not found" in str(rehydrate(workspace, _entry()))


def test_rehydrate_falls_back_to_memory_basename(workspace: Path) -> None:
    _note(workspace)
    assert rehydrate(workspace, _entry(path="old/place/2024-05-01.md"))[:2] == (3, 4)


def test_rehydrate_refuses_paths_outside_the_workspace(workspace: Path) -> None:
    _note(workspace)
    assert isinstance(rehydrate(workspace, _entry(path="../ws/memory/2024-05-01.md")), str)


def test_unpromotable_snippet_is_skipped(workspace: Path) -> None:
    _note(workspace, "# 2024-05-01\n\n## Tasks\n- \n")
    entry = _entry(start=3, end=4, snippet="## Tasks -")
    result = apply_promotions(workspace, [_cand(entry)], day=DAY)
    assert result.applied == [] and [k for k, _ in result.skipped] == [entry.key]
    assert "promotable" in result.skipped[0][1]
    assert not (workspace / "MEMORY.md").exists()


# --- the section -----------------------------------------------------------------------------


def test_section_format_is_exact(workspace: Path) -> None:
    _note(workspace)
    memory = workspace / "MEMORY.md"
    memory.write_text("# Long-Term Memory\n\nHuman note.\n")
    result = apply_promotions(workspace, [_cand(_entry())], day=DAY)
    assert memory.read_text() == "# Long-Term Memory\n\nHuman note.\n" + SECTION
    assert [a.key for a in result.applied] == [f"memory:{NOTE}:3:4"]
    assert result.applied[0].path == NOTE and result.memory_path == str(memory)
    assert result.dropped_sections == 0


@pytest.mark.parametrize("existing", [None, ""])
def test_first_promotion_writes_the_header(workspace: Path, existing: str | None) -> None:
    _note(workspace)
    memory = workspace / "MEMORY.md"
    if existing is not None:
        memory.write_text(existing)
    apply_promotions(workspace, [_cand(_entry())], day=DAY)
    assert memory.read_text() == "# Long-Term Memory\n" + SECTION


def test_missing_final_newline_is_added_before_the_section(workspace: Path) -> None:
    _note(workspace)
    memory = workspace / "MEMORY.md"
    memory.write_text("Human note without newline")
    apply_promotions(workspace, [_cand(_entry())], day=DAY)
    assert memory.read_text() == "Human note without newline\n" + SECTION


def test_moved_lines_are_promoted_with_their_new_range(workspace: Path) -> None:
    _note(workspace, "new line\n" + DAILY)
    result = apply_promotions(workspace, [_cand(_entry())], day=DAY)
    assert (result.applied[0].start_line, result.applied[0].end_line) == (4, 5)
    assert f"source={NOTE}:4-5]" in (workspace / "MEMORY.md").read_text()


def test_second_run_appends_nothing(workspace: Path) -> None:
    _note(workspace)
    first = apply_promotions(workspace, [_cand(_entry())], day=DAY)
    before = (workspace / "MEMORY.md").read_text()
    second = apply_promotions(workspace, [_cand(_entry())], day=date(2024, 5, 3))
    assert len(first.applied) == 1
    assert second.applied == [] and second.already_present == [f"memory:{NOTE}:3:4"]
    assert (workspace / "MEMORY.md").read_text() == before


def test_reference_markers_count_as_present(workspace: Path) -> None:
    _note(workspace)
    memory = workspace / "MEMORY.md"
    text = f"# Long-Term Memory\n\n<!-- openclaw-memory-promotion:memory:{NOTE}:3:4 -->\n- old\n"
    memory.write_text(text)
    result = apply_promotions(workspace, [_cand(_entry())], day=DAY)
    assert result.already_present == [f"memory:{NOTE}:3:4"] and result.applied == []
    assert memory.read_text() == text


def test_symlinked_memory_file_is_refused(workspace: Path, tmp_path: Path) -> None:
    _note(workspace)
    target = tmp_path / "elsewhere.md"
    target.write_text("x\n")
    (workspace / "MEMORY.md").symlink_to(target)
    with pytest.raises(PathRefused):
        apply_promotions(workspace, [_cand(_entry())], day=DAY)
    assert target.read_text() == "x\n"


# --- the size budget -------------------------------------------------------------------------


def _old_section(day: str, n: int) -> str:
    return f"\n## Promoted From Short-Term Memory ({day})\n\n" + _bullet(
        f"memory:old:{n}", f"old fact number {n} " + "x" * 60, f"memory/{day}.md:1-1"
    )


def test_budget_drops_only_the_oldest_promoted_sections(workspace: Path) -> None:
    _note(workspace)
    memory = workspace / "MEMORY.md"
    human = "# Long-Term Memory\n\nI prefer tabs.\n"
    text = (
        human
        + _old_section("2024-01-01", 1)
        + "a line a human added under the oldest section\n"
        + _old_section("2024-02-01", 2)
        + "\n## My own heading\n\nMy own text.\n"
        + _old_section("2024-03-01", 3)
    )
    memory.write_text(text)
    os.chmod(memory, 0o640)
    expected = (
        human
        + "\na line a human added under the oldest section\n"
        + "\n## My own heading\n\nMy own text.\n"
        + _old_section("2024-03-01", 3)
        + SECTION
    )
    limit = len(expected) + 10  # fits once the two oldest sections are gone, not after one
    result = apply_promotions(workspace, [_cand(_entry())], day=DAY, max_chars=limit)
    assert result.dropped_sections == 2 and len(result.applied) == 1
    assert memory.read_text() == expected
    assert stat.S_IMODE(memory.stat().st_mode) == 0o640


def test_section_is_written_even_when_the_budget_cannot_be_met(workspace: Path) -> None:
    _note(workspace)
    memory = workspace / "MEMORY.md"
    human = "# Long-Term Memory\n\n" + "A long human paragraph. " * 20 + "\n"
    memory.write_text(human + _old_section("2024-01-01", 1))
    result = apply_promotions(workspace, [_cand(_entry())], day=DAY, max_chars=100)
    assert result.dropped_sections == 1
    assert memory.read_text() == human + SECTION


def test_zero_budget_never_trims(workspace: Path) -> None:
    _note(workspace)
    memory = workspace / "MEMORY.md"
    text = "# Long-Term Memory\n" + _old_section("2024-01-01", 1)
    memory.write_text(text)
    result = apply_promotions(workspace, [_cand(_entry())], day=DAY, max_chars=0)
    assert result.dropped_sections == 0 and memory.read_text() == text + SECTION


def _edit_on_temp_fsync(memory: Path, times: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Append a human line to MEMORY.md whenever promotion fsyncs its temp file."""
    real = sharedfile.fsync
    added: list[str] = []

    def fsync(fd: int) -> None:
        real(fd)
        if len(added) < times and os.readlink(f"/proc/self/fd/{fd}") != str(memory):
            added.append(f"edit during promotion {len(added)}")
            with open(memory, "a") as f:
                f.write(added[-1] + "\n")

    monkeypatch.setattr(sharedfile, "fsync", fsync)
    return added


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_budget_rewrite_starts_over_when_the_file_changes(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _note(workspace)
    memory = workspace / "MEMORY.md"
    memory.write_text("# Long-Term Memory\n" + _old_section("2024-01-01", 1))
    added = _edit_on_temp_fsync(memory, 2, monkeypatch)
    result = apply_promotions(workspace, [_cand(_entry())], day=DAY, max_chars=200)
    got = memory.read_text()
    assert len(added) == 2 and all(got.count(line) == 1 for line in added)
    assert result.dropped_sections == 1 and "memory:old:1" not in got
    assert got.count("<!-- memd-promotion:") == 1


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_budget_rewrite_falls_back_to_append_when_the_file_keeps_changing(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _note(workspace)
    memory = workspace / "MEMORY.md"
    memory.write_text("# Long-Term Memory\n" + _old_section("2024-01-01", 1))
    added = _edit_on_temp_fsync(memory, 100, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="memd.dreams.promote"):
        result = apply_promotions(workspace, [_cand(_entry())], day=DAY, max_chars=200)
    got = memory.read_text()
    assert len(added) == promote.CAS_ATTEMPTS
    assert all(got.count(line) == 1 for line in added)
    assert result.dropped_sections == 0 and "memory:old:1" in got and len(result.applied) == 1
    assert "kept changing" in caplog.text
    assert not [p for p in workspace.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_writer_that_opened_the_file_before_the_swap_keeps_its_line(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`echo line >> MEMORY.md` opens the file, then writes: descheduled in between (a loaded
    machine), it writes to the old file after the trim swapped a new one in. However late that
    write comes, the line ends up in MEMORY.md."""
    _note(workspace)
    memory = workspace / "MEMORY.md"
    memory.write_text("# Long-Term Memory\n" + _old_section("2024-01-01", 1))
    real = sharedfile.fsync
    writers: list[threading.Thread] = []

    def late_write(f: object) -> None:
        time.sleep(0.3)  # far past any grace a writer could be given
        f.write("a late human line\n")  # type: ignore[attr-defined]
        f.close()  # type: ignore[attr-defined]

    def fsync(fd: int) -> None:  # the temp file is ready: the swap comes next
        real(fd)
        if not writers and os.readlink(f"/proc/self/fd/{fd}") != str(memory):
            writers.append(threading.Thread(target=late_write, args=(open(memory, "a"),)))
            writers[0].start()

    monkeypatch.setattr(sharedfile, "fsync", fsync)
    apply_promotions(workspace, [_cand(_entry())], day=DAY, max_chars=200)
    writers[0].join()
    got = memory.read_text()
    assert got.count("a late human line") == 1
    assert got.count("<!-- memd-promotion:") >= 1


# --- concurrent human edits ------------------------------------------------------------------


def _append_line(memory: Path, line: str) -> None:
    with open(memory, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _editor_save(memory: Path, line: str) -> None:
    """What gedit, vim (backupcopy=no) and agents do: read, write a temp file, rename it over."""
    text = memory.read_text(encoding="utf-8") if memory.exists() else ""
    tmp = memory.with_name(".MEMORY.md.editor")
    tmp.write_text(text + line + "\n", encoding="utf-8")
    os.replace(tmp, memory)


@pytest.mark.parametrize("max_chars", [0, 600], ids=["append", "budget"])
@pytest.mark.parametrize("edit", [_append_line, _editor_save], ids=["appender", "editor"])
def test_concurrent_human_edits_survive(
    workspace: Path, edit: Callable[[Path, str], None], max_chars: int
) -> None:
    rounds = 25
    note = "".join(
        f"Fact {i}: the service on port {8000 + i} belongs to team {i}.\n" for i in range(rounds)
    )
    _note(workspace, note)
    memory = workspace / "MEMORY.md"
    memory.write_text("# Long-Term Memory\n\nHuman preamble.\n")
    cands = [
        _cand(
            _entry(
                start=i + 1,
                end=i + 1,
                snippet=f"Fact {i}: the service on port {8000 + i} belongs to team {i}.",
            )
        )
        for i in range(rounds)
    ]
    done = threading.Event()
    human: list[str] = []
    errors: list[BaseException] = []
    results: list[PromotionResult] = []

    def person() -> None:
        try:
            while not done.is_set():
                human.append(f"human line {len(human)}")
                edit(memory, human[-1])
                time.sleep(random.uniform(0.0002, 0.003))
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    thread = threading.Thread(target=person)
    thread.start()
    try:
        for i in range(rounds):
            day = date(2024, 5, 1 + i)
            results.append(
                apply_promotions(workspace, cands[i : i + 1], day=day, max_chars=max_chars)
            )
            time.sleep(0.002)
        # On a loaded machine the person may have had few turns: give them a few more.
        deadline = time.monotonic() + 10
        while len(human) <= rounds and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.01)
    finally:
        done.set()
        thread.join()
    assert not errors
    # Quiescence: re-apply every entry, as the recall store would for one whose marker is gone.
    final = apply_promotions(workspace, cands, day=date(2024, 6, 1), max_chars=max_chars)
    text = memory.read_text(encoding="utf-8")
    lines = Counter(text.splitlines())
    assert len(human) > rounds
    assert [h for h in human if lines[h] != 1] == []
    assert lines["Human preamble."] == 1
    markers = Counter(line for line in text.splitlines() if line.startswith("<!-- memd-promotion:"))
    assert all(n == 1 for n in markers.values())
    if max_chars == 0:
        assert len(markers) == rounds
        assert sum(r.dropped_sections for r in results) == 0
    else:
        # A hammering editor may defeat every compare-and-swap of a round (it then appends); the
        # quiescent run must trim.
        assert final.dropped_sections > 0
        assert all(f"<!-- memd-promotion:{a.key} -->" in markers for a in final.applied)
    assert not [p for p in workspace.iterdir() if p.name.endswith(".tmp")]


def test_memory_md_with_a_second_name_is_not_written_through(workspace: Path) -> None:
    """A hard link to MEMORY.md elsewhere would change with it: promotion refuses, naming
    why, and both names keep their text."""
    _note(workspace)
    memory = workspace / "MEMORY.md"
    memory.write_text("# Long-Term Memory\n\nHuman line.\n")
    elsewhere = workspace.parent / "outside.md"
    os.link(memory, elsewhere)
    with pytest.raises(PathRefused, match="hard links"):
        apply_promotions(workspace, [_cand(_entry())], day=DAY, max_chars=0)
    assert memory.read_text() == elsewhere.read_text() == "# Long-Term Memory\n\nHuman line.\n"
