"""The file watcher: debouncing, real watchdog observers on real files, health checks, fallbacks."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from watchdog.events import FileCreatedEvent
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from memd.changes import Changes
from memd.watch import Debouncer, WorkspaceWatcher
from memd.watch.fstype import filesystem_type, network_filesystem
from memd.watch.layout import WatchLayout

WAIT_S = 5.0

# watchdog's recursive inotify watch adds a directory made with its parents (mkdir -p) twice and
# warns about it from its reader thread: harmless, but filterwarnings=error would kill that thread.
pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")


class Recorder:
    """An on_change callback that records batches and lets a test wait for changes."""

    def __init__(self) -> None:
        self.batches: list[Changes] = []
        self.times: list[float] = []
        self.threads: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, keys: Changes) -> None:
        with self._cond:
            self.batches.append(keys)
            self.times.append(time.monotonic())
            self.threads.append(threading.current_thread().name)
            self._cond.notify_all()

    @property
    def keys(self) -> set[str]:
        """The changed paths of every batch so far."""
        return set(self.changes.paths)

    @property
    def changes(self) -> Changes:
        with self._cond:
            return _merged(self.batches)

    def clear(self) -> None:
        with self._cond:
            self.batches.clear()
            self.times.clear()

    def wait(self, pred: Callable[[Changes], bool], timeout: float = WAIT_S) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: pred(_merged(self.batches)), timeout)

    def wait_key(self, key: str, timeout: float = WAIT_S) -> bool:
        return self.wait(lambda changes: key in changes.paths, timeout)

    def wait_rescan(self, timeout: float = WAIT_S) -> bool:
        return self.wait(lambda changes: changes.rescan_all, timeout)


def _merged(batches: list[Changes]) -> Changes:
    merged = Changes()
    for batch in batches:
        merged |= batch
    return merged


def ch(*paths: str) -> Changes:
    return Changes.of(paths)


def wait_until(pred: Callable[[], bool], timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


MakeWatcher = Callable[..., tuple[WorkspaceWatcher, Recorder]]


@pytest.fixture
def make_watcher(workspace: Path) -> Iterator[MakeWatcher]:
    made: list[WorkspaceWatcher] = []

    def _make(
        extra_paths: tuple[str, ...] = (), root: Path | None = None, **kw: Any
    ) -> tuple[WorkspaceWatcher, Recorder]:
        rec = Recorder()
        kw.setdefault("debounce_ms", 100)
        kw.setdefault("poll_interval_s", 0.1)
        w = WorkspaceWatcher(root or workspace, extra_paths, rec, **kw)
        made.append(w)
        w.start()
        return w, rec

    yield _make
    for w in made:
        w.stop()


def kill_observer(w: WorkspaceWatcher) -> None:
    """Stop the observer behind the watcher's back: its thread exits, as when it dies."""
    obs = w.observer
    assert obs is not None
    obs.stop()
    obs.join()


# --- Debouncer ---------------------------------------------------------------------------------


def test_debouncer_coalesces_a_burst() -> None:
    rec = Recorder()
    with Debouncer(rec, 0.2) as d:
        for key in ("a", "b", "a", "c"):
            d.push(ch(key))
        assert d.pending() == 3
        assert rec.wait(lambda keys: bool(keys))
    assert rec.batches == [ch("a", "b", "c")]
    assert rec.threads == ["memd-debounce"]


def test_debouncer_restarts_the_timer_on_each_key() -> None:
    rec = Recorder()
    with Debouncer(rec, 0.5) as d:
        d.push(ch("a"))
        time.sleep(0.1)
        second = time.monotonic()
        d.push(ch("b"))
        assert rec.wait(lambda keys: bool(keys))
    assert rec.batches == [ch("a", "b")]
    assert rec.times[0] - second >= 0.5  # timed from the last key, not the first


def test_debouncer_max_wait_fires_during_a_constant_stream() -> None:
    rec = Recorder()
    with Debouncer(rec, 0.3, max_wait_s=0.4) as d:
        start = time.monotonic()
        while time.monotonic() - start < 1.5:
            d.push(ch("busy.md"))
            time.sleep(0.02)
        stream_end = time.monotonic()
        assert rec.batches, "nothing delivered while events kept coming"
        assert rec.times[0] < stream_end
        assert rec.times[0] - start < 1.2


def test_debouncer_stop_delivers_pending_keys() -> None:
    rec = Recorder()
    d = Debouncer(rec, 30.0)
    d.start()
    d.push(ch("x"))
    d.stop()
    assert rec.batches == [ch("x")]
    assert rec.threads == ["memd-debounce"]
    d.stop()  # idempotent
    assert d.pending() == 0


def test_debouncer_flush_and_failing_callback(caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder()
    calls: list[Changes] = []

    def callback(keys: Changes) -> None:
        calls.append(keys)
        if len(calls) == 1:
            raise RuntimeError("boom")
        rec(keys)

    with Debouncer(callback, 30.0) as d:
        d.push(ch("a"))
        d.flush()
        assert wait_until(lambda: len(calls) == 1)
        d.push(ch("b"))
        d.flush()
        assert rec.wait_key("b")  # the thread survived the exception
    assert "debounced callback failed" in caplog.text


# --- Watcher: events --------------------------------------------------------------------------


def test_reports_create_modify_delete_under_memory(
    workspace: Path, make_watcher: MakeWatcher
) -> None:
    w, rec = make_watcher()
    assert (w.state, w.reason) == ("watching", None)
    assert w.backend in {"inotify", "fsevents", "kqueue", "windowsapi"}
    path = workspace / "memory" / "a.md"
    path.write_text("one")
    assert rec.wait_key("memory/a.md")
    assert w.last_event_at is not None
    rec.clear()
    with path.open("a") as f:
        f.write("two")
    assert rec.wait_key("memory/a.md")
    rec.clear()
    path.unlink()
    assert rec.wait_key("memory/a.md")


def test_new_subfolder_is_watched(workspace: Path, make_watcher: MakeWatcher) -> None:
    _, rec = make_watcher()
    sub = workspace / "memory" / "projects" / "deep"
    sub.mkdir(parents=True)
    (sub / "first.md").write_text("x")
    assert rec.wait(lambda k: "memory/projects/deep/first.md" in k.paths or k.rescan_all)
    rec.clear()
    (sub / "second.md").write_text("y")
    assert rec.wait_key("memory/projects/deep/second.md")


def test_reports_root_memory_md_only(workspace: Path, make_watcher: MakeWatcher) -> None:
    _, rec = make_watcher()
    (workspace / "README.md").write_text("not memory")
    (workspace / "node_modules").mkdir()
    (workspace / "node_modules" / "x.md").write_text("no")
    (workspace / "MEMORY.md").write_text("evergreen")
    assert rec.wait_key("MEMORY.md")
    assert rec.keys == {"MEMORY.md"}


def test_atomic_save_reports_the_target(workspace: Path, make_watcher: MakeWatcher) -> None:
    target = workspace / "memory" / "x.md"
    target.write_text("old")
    _, rec = make_watcher()
    tmp = workspace / "memory" / ".x.md.tmp-1234"
    tmp.write_text("new")
    os.replace(tmp, target)
    assert rec.wait_key("memory/x.md")
    assert rec.keys == {"memory/x.md"}


def test_rename_reports_both_names(workspace: Path, make_watcher: MakeWatcher) -> None:
    (workspace / "memory" / "a.md").write_text("a")
    _, rec = make_watcher()
    os.rename(workspace / "memory" / "a.md", workspace / "memory" / "b.md")
    assert rec.wait(lambda k: {"memory/a.md", "memory/b.md"} <= k.paths)


def test_ignored_and_non_markdown_files_are_not_reported(
    workspace: Path, make_watcher: MakeWatcher
) -> None:
    _, rec = make_watcher()
    mem = workspace / "memory"
    (mem / ".x.md.swp").write_text("vim swap")
    (mem / "4913").write_text("vim probe")
    (mem / ".#x.md").write_text("emacs lock")
    (mem / "notes.txt").write_text("text")
    (mem / "node_modules").mkdir()
    (mem / "node_modules" / "pkg.md").write_text("dependency readme")
    (mem / "z.md").write_text("sentinel")  # events arrive in order: once seen, the rest were
    assert rec.wait_key("memory/z.md")
    assert rec.keys == {"memory/z.md"}


def test_memory_dir_deleted_and_recreated(workspace: Path, make_watcher: MakeWatcher) -> None:
    _, rec = make_watcher()
    (workspace / "memory" / "a.md").write_text("a")
    assert rec.wait_key("memory/a.md")
    shutil.rmtree(workspace / "memory")
    assert rec.wait_rescan()
    rec.clear()
    (workspace / "memory").mkdir()
    assert rec.wait_rescan()  # the new directory is watched before the rescan is reported
    rec.clear()
    (workspace / "memory" / "new.md").write_text("n")
    assert rec.wait_key("memory/new.md")
    # Replaced in one go (rm -rf memory && mkdir memory): noticed by inode.
    rec.clear()
    shutil.rmtree(workspace / "memory")
    (workspace / "memory").mkdir()
    assert rec.wait_rescan()
    rec.clear()
    (workspace / "memory" / "again.md").write_text("a")
    assert rec.wait_key("memory/again.md")


def test_extra_paths(tmp_path: Path, workspace: Path, make_watcher: MakeWatcher) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (tmp_path / "single.md").write_text("x")
    _, rec = make_watcher(extra_paths=("../notes", str(tmp_path / "single.md"), "later"))
    (notes / "deep").mkdir()
    (notes / "deep" / "n.md").write_text("n")
    (tmp_path / "sibling.md").write_text("not an extra path")
    (tmp_path / "single.md").write_text("changed")
    assert rec.wait(lambda k: {"../single.md", "../notes/deep/n.md"} <= k.paths)
    assert "../sibling.md" not in rec.keys
    # An extra directory that appears inside the workspace after start is picked up.
    rec.clear()
    (workspace / "later").mkdir()
    assert rec.wait_rescan()
    rec.clear()
    (workspace / "later" / "l.md").write_text("l")
    assert rec.wait_key("later/l.md")


def test_extra_path_containing_the_workspace_is_not_watched(workspace: Path) -> None:
    layout = WatchLayout.build(workspace, ("..", ".", "notes"))
    assert layout.extras == (str(workspace / "notes"),)
    assert layout.desired() == {str(workspace): False, str(workspace / "memory"): True}


# --- Watcher: health and fallbacks -------------------------------------------------------------


def test_dead_observer_is_restarted(workspace: Path, make_watcher: MakeWatcher) -> None:
    w, rec = make_watcher()
    assert w.check_health() is True
    kill_observer(w)
    assert w.check_health() is False
    assert (w.state, w.restarts) == ("watching", 1)
    assert rec.wait_rescan()  # events may have been lost: rescan
    rec.clear()
    (workspace / "memory" / "after.md").write_text("x")
    assert rec.wait_key("memory/after.md")
    assert w.check_health() is True


def test_dead_emitter_is_restarted(workspace: Path, make_watcher: MakeWatcher) -> None:
    w, rec = make_watcher()
    assert w.observer is not None
    (emitter,) = [e for e in w.observer.emitters if e.watch.path == str(workspace / "memory")]
    emitter.stop()
    emitter.join()
    assert w.check_health() is False
    assert w.restarts == 1
    assert rec.wait_rescan()
    rec.clear()
    (workspace / "memory" / "after.md").write_text("x")
    assert rec.wait_key("memory/after.md")


def test_dead_inotify_reader_is_restarted(workspace: Path, make_watcher: MakeWatcher) -> None:
    w, rec = make_watcher()
    reader = getattr(w.observer, "_inotify_fd", None)  # watchdog internals: nothing else kills it
    if not isinstance(reader, threading.Thread):
        pytest.skip("inotify only")
    reader.stop()  # type: ignore[attr-defined]
    reader.join()
    assert w.check_health() is False
    assert w.restarts == 1
    assert rec.wait_rescan()
    rec.clear()
    (workspace / "memory" / "after.md").write_text("x")
    assert rec.wait_key("memory/after.md")


def test_handler_exception_does_not_kill_the_observer(
    workspace: Path, make_watcher: MakeWatcher, caplog: pytest.LogCaptureFixture
) -> None:
    w, rec = make_watcher()
    obs = w.observer
    assert obs is not None
    watch = next(iter(obs.emitters)).watch
    obs.event_queue.put((FileCreatedEvent(12345), watch))  # type: ignore[arg-type]  # malformed
    assert rec.wait_rescan()
    assert obs.is_alive()
    assert "could not handle" in caplog.text
    (workspace / "memory" / "ok.md").write_text("x")
    assert rec.wait_key("memory/ok.md")
    assert w.check_health() is True


def test_too_many_restarts_fall_back_to_polling(workspace: Path, make_watcher: MakeWatcher) -> None:
    w, rec = make_watcher()
    for _ in range(3):
        kill_observer(w)
        w.check_health()
        assert w.state == "watching"
    kill_observer(w)
    w.check_health()
    assert (w.state, w.backend, w.restarts) == ("polling", "polling", 4)
    assert w.reason is not None and "restarted 4 times" in w.reason
    rec.clear()
    (workspace / "memory" / "polled.md").write_text("x")
    assert rec.wait_key("memory/polled.md")


def test_polling_mode(workspace: Path, make_watcher: MakeWatcher) -> None:
    w, rec = make_watcher(polling=True)
    assert (w.state, w.backend, w.reason) == ("polling", "polling", "polling requested")
    (workspace / "memory" / "p.md").write_text("p")
    (workspace / "MEMORY.md").write_text("m")
    assert rec.wait(lambda k: {"memory/p.md", "MEMORY.md"} <= k.paths)
    kill_observer(w)
    assert w.check_health() is False
    assert (w.state, w.restarts) == ("polling", 1)


class _NoSpaceObserver(PollingObserver):
    """Starts like inotify does when fs.inotify.max_user_watches is exhausted."""

    def start(self) -> None:
        raise OSError(errno.ENOSPC, "inotify watch limit reached")


def test_watch_limit_at_start_falls_back_to_polling(
    workspace: Path, make_watcher: MakeWatcher, caplog: pytest.LogCaptureFixture
) -> None:
    """ENOSPC cannot be provoked without root (sysctl), so it is injected via observer_factory."""

    def factory(polling: bool) -> BaseObserver:
        return PollingObserver(timeout=0.1) if polling else _NoSpaceObserver()

    with caplog.at_level(logging.WARNING, logger="memd.watch"):
        w, rec = make_watcher(observer_factory=factory)
    assert (w.state, w.backend) == ("polling", "polling")
    assert w.reason is not None and "ENOSPC" in w.reason and "max_user_watches" in w.reason
    assert caplog.text.count("polling instead") == 1
    (workspace / "memory" / "p.md").write_text("p")
    assert rec.wait_key("memory/p.md")


def test_instance_limit_on_restart_falls_back_to_polling(
    workspace: Path, make_watcher: MakeWatcher
) -> None:
    """EMFILE (inotify instances exhausted) is injected via observer_factory on the 2nd native try."""
    native: list[int] = []

    def factory(polling: bool) -> BaseObserver:
        if polling:
            return PollingObserver(timeout=0.1)
        native.append(1)
        if len(native) > 1:
            raise OSError(errno.EMFILE, "inotify instance limit reached")
        return Observer()

    w, rec = make_watcher(observer_factory=factory)
    assert w.state == "watching"
    kill_observer(w)
    assert w.check_health() is False
    assert (w.state, w.restarts) == ("polling", 1)
    assert w.reason is not None and "EMFILE" in w.reason
    assert rec.wait_rescan()


def test_missing_workspace_fails_then_recovers(tmp_path: Path, make_watcher: MakeWatcher) -> None:
    root = tmp_path / "later-ws"
    w, rec = make_watcher(root=root)
    assert w.state == "failed"
    assert w.reason is not None and "missing" in w.reason
    assert w.check_health() is False
    (root / "memory").mkdir(parents=True)
    assert w.check_health() is False  # recovered on this call
    assert w.state == "watching"
    assert rec.wait_rescan()
    rec.clear()
    (root / "memory" / "m.md").write_text("m")
    assert rec.wait_key("memory/m.md")
    assert w.check_health() is True


def test_stop_is_idempotent_and_delivers_pending(workspace: Path) -> None:
    rec = Recorder()
    w = WorkspaceWatcher(workspace, (), rec, debounce_ms=30_000)
    assert w.state == "stopped"
    w.start()
    (workspace / "memory" / "late.md").write_text("x")
    assert wait_until(lambda: w.pending() == 1)
    w.stop()
    w.stop()
    assert w.state == "stopped"
    assert rec.keys == {"memory/late.md"}
    w.start()  # a stopped watcher stays stopped
    assert w.state == "stopped" and w.check_health() is True


# --- Network filesystems -----------------------------------------------------------------------

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /mnt/share rw,relatime shared:20 - nfs4 srv:/export rw,vers=4.2
41 40 0:36 / /mnt/share/local\\040disk rw - ext4 /dev/sdb1 rw
"""


def test_network_filesystem_detection() -> None:
    assert network_filesystem("/mnt/share/ws", MOUNTINFO) == "nfs4"
    assert network_filesystem("/mnt/share/local disk/ws", MOUNTINFO) is None
    assert filesystem_type("/mnt/share/local disk/ws", MOUNTINFO) == "ext4"
    assert network_filesystem("/home/me/ws", MOUNTINFO) is None
    assert filesystem_type("/x", "garbage\n") is None


def test_layout_keys(tmp_path: Path, workspace: Path) -> None:
    cache_notes = tmp_path / ".cache" / "notes"
    layout = WatchLayout.build(workspace, (str(cache_notes), "../one.md"))
    ws = str(workspace)
    assert layout.key_for(f"{ws}/memory/a/b.md", is_dir=False) == ch("memory/a/b.md")
    assert layout.key_for(f"{ws}/memory/a", is_dir=True) == Changes.everything()
    assert layout.key_for(f"{ws}/memory/.git", is_dir=True) is None
    assert layout.key_for(f"{ws}/memory/x.md~", is_dir=False) is None
    assert layout.key_for(f"{ws}/memory", is_dir=True) == Changes.everything()
    assert layout.key_for(f"{ws}/memory.md", is_dir=False) == ch("memory.md")
    assert layout.key_for(f"{ws}/memory/*.md", is_dir=False) == ch("memory/*.md")  # no rescan
    assert layout.key_for(f"{ws}/notes.md", is_dir=False) is None
    # Ignore rules apply below an extra directory, not to the directory's own path.
    assert layout.key_for(f"{cache_notes}/n.md", is_dir=False) == ch("../.cache/notes/n.md")
    assert layout.key_for(f"{cache_notes}/.venv/n.md", is_dir=False) is None
    assert layout.key_for(str(tmp_path / "one.md"), is_dir=False) == ch("../one.md")
    assert layout.key_for(str(tmp_path / "two.md"), is_dir=False) is None


def test_debouncer_keys_being_delivered_are_still_pending() -> None:
    """Between the debouncer handing a batch over and the writer holding it, a reply asking
    what is pending must find it in one place or the other, never in neither."""
    inside, release = threading.Event(), threading.Event()

    def slow(keys: Changes) -> None:
        inside.set()
        release.wait(WAIT_S)

    with Debouncer(slow, 0.0) as d:
        d.push(ch("memory/a.md"))
        assert inside.wait(WAIT_S)
        assert d.pending_keys() == ch("memory/a.md")
        release.set()
        deadline = time.monotonic() + WAIT_S
        while d.pending_keys() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert d.pending_keys() == Changes()


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify")


def probe_of(root: Path, extras: tuple[str, ...] = ()) -> tuple[Any, Recorder]:
    from memd.watch.probe import ChangeProbe

    seen = Recorder()
    probe = ChangeProbe(WatchLayout.build(root, extras), seen)
    assert probe.start(), probe.dead
    return probe, seen


@linux_only
def test_the_probe_knows_an_edit_as_soon_as_the_write_returns(workspace: Path) -> None:
    """No thread in between: the reply that reads the probe after a write sees it."""
    probe, seen = probe_of(workspace)
    try:
        armed = probe.view()
        assert armed is not None and armed.keys == frozenset()
        for n in range(50):  # each at once, not after some delay
            (workspace / "memory" / f"n{n}.md").write_text("x\n")
            view = probe.view()
            assert view is not None and f"memory/n{n}.md" in view.keys
        with (workspace / "MEMORY.md").open("a") as f:
            f.write("appended\n")
            f.flush()
            view = probe.view()  # still open: the write itself is seen
        assert view is not None and "MEMORY.md" in view.keys
        assert "MEMORY.md" in seen.keys, "what it saw goes on to the writer"
        probe.view()  # the close, too
        probe.settle({"MEMORY.md"})  # found indexed as it is on disk
        view = probe.view()
        assert view is not None and "MEMORY.md" not in view.keys
        (workspace / "MEMORY.md").write_text("rewritten\n")  # a later edit: known again
        view = probe.view()
        assert view is not None and "MEMORY.md" in view.keys
        (workspace / "notes.txt").write_text("not memory\n")
        (workspace / "memory" / "x.txt").write_text("not memory\n")
        view = probe.view()
        assert view is not None and not {"notes.txt", "memory/x.txt"} & view.keys
    finally:
        probe.close()


@linux_only
def test_the_probe_watches_new_folders_and_asks_for_a_rescan(workspace: Path) -> None:
    probe, seen = probe_of(workspace)
    try:
        before = probe.view()
        assert before is not None
        (workspace / "memory" / "sub" / "deeper").mkdir(parents=True)
        view = probe.view()
        assert view is not None and view.rescan_after > before.rescan_after
        assert seen.changes.rescan_all
        (workspace / "memory" / "sub" / "deeper" / "y.md").write_text("y\n")
        view = probe.view()
        assert view is not None and "memory/sub/deeper/y.md" in view.keys
    finally:
        probe.close()


@linux_only
def test_the_probe_asks_for_a_rescan_when_the_kernel_drops_events(workspace: Path) -> None:
    limit = Path("/proc/sys/fs/inotify/max_queued_events")
    queue = int(limit.read_text()) if limit.exists() else 16384
    probe, seen = probe_of(workspace)
    try:
        before = probe.view()
        assert before is not None
        for n in range(queue // 2 + 100):  # two events a file (create, close): over the queue
            (workspace / "memory" / f"b{n}.md").touch()
        view = probe.view()
        assert view is not None and view.rescan_after > before.rescan_after
        assert seen.changes.rescan_all
    finally:
        probe.close()


@linux_only
def test_the_probe_gives_up_when_the_workspace_directory_goes(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    probe, seen = probe_of(root)
    try:
        root.rename(tmp_path / "elsewhere")
        assert probe.view() is None and probe.dead
        assert seen.changes.rescan_all
    finally:
        probe.close()


@linux_only
def test_a_watcher_runs_a_probe_while_it_watches_natively(
    workspace: Path, make_watcher: MakeWatcher
) -> None:
    w, _ = make_watcher(debounce_ms=60_000)
    view = w.probe()
    assert w.backend == "inotify" and view is not None
    (workspace / "memory" / "z.md").write_text("z\n")
    view = w.probe()
    assert view is not None and "memory/z.md" in view.keys
    assert "memory/z.md" in w.pending_keys().paths, "handed to the debouncer at once"
