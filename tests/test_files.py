"""Path safety and line windows of ``get`` on real files in tmp_path (no mocks)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memd.markdown.read import GetResult, read_lines, resolve_memory_path
from memd_client.errors import BadRequest, PathRefused

SECRET = "SECRET"


def write(path: Path, text: str = "x\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def build(base: Path) -> Path:
    """A workspace full of traps; every byte outside the memory files contains SECRET."""
    outside = base / "outside"
    write(outside / "secret.md", f"{SECRET}-OUTSIDE\n")
    write(outside / "passwd", f"{SECRET}-PASSWD\n")
    write(base / "extra" / "e.md", "extra note\n")
    write(base / "extrafile.md", "extra file\n")
    write(base / "sibling.md", f"{SECRET}-SIBLING\n")
    ws = base / "ws"
    write(ws / "MEMORY.md", "evergreen one\nevergreen two\n")
    write(ws / "DREAMS.md", "dreams\n")
    write(ws / "SOUL.md", f"{SECRET}-SOUL\n")
    write(ws / "notes" / "n.md", f"{SECRET}-NOTES\n")
    mem = ws / "memory"
    write(mem / "a.md", "alpha\n")
    write(mem / "sub" / "b.md", "beta\n")
    write(mem / "notes.txt", f"{SECRET}-TXT\n")
    (mem / "pw.md").symlink_to("/etc/passwd")
    (mem / "secret.md").symlink_to(outside / "secret.md")
    (mem / "rel-secret.md").symlink_to("../../outside/secret.md")
    (mem / "out").symlink_to("/", target_is_directory=True)
    (mem / "outdir").symlink_to(outside, target_is_directory=True)
    (mem / "loop.md").symlink_to("loop.md")
    (mem / "loopa.md").symlink_to("loopb.md")
    (mem / "loopb.md").symlink_to("loopa.md")
    (mem / "loopdir").symlink_to("loopdir", target_is_directory=True)
    os.mkfifo(mem / "fifo.md")
    (mem / "d.md").mkdir()
    (mem / "zero.md").symlink_to("/dev/zero")
    (mem / "soul.md").symlink_to("../SOUL.md")
    (mem / "txt.md").symlink_to("notes.txt")
    (mem / "good.md").symlink_to("../MEMORY.md")
    (mem / "subalias").symlink_to("sub", target_is_directory=True)
    (base / "extralink").symlink_to(outside, target_is_directory=True)
    (base / "extra" / "escape.md").symlink_to(outside / "secret.md")
    return ws


def extras(ws: Path) -> list[str]:
    return ["../extra", str(ws.parent / "extrafile.md"), "../extralink"]


@pytest.fixture()
def ws(tmp_path: Path) -> Path:
    return build(tmp_path)


@pytest.fixture(scope="module")
def shared_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("prop"))


def hostile(ws: Path) -> list[tuple[object, str]]:
    """(path, expected outcome): refused | missing | bad | ok:<expected text>."""
    out = ws.parent / "outside"
    return [
        ("../outside/secret.md", "refused"),
        ("../../etc/passwd", "refused"),
        ("../" * 20 + "etc/passwd", "refused"),
        ("memory/../SOUL.md", "refused"),
        ("memory/../../outside/secret.md", "refused"),
        ("memory/sub/../../SOUL.md", "refused"),
        ("memory/sub/../a.md", "refused"),
        ("./memory/../MEMORY.md", "refused"),
        ("memory/./../SOUL.md", "refused"),
        ("../extra/../outside/secret.md", "refused"),
        ("../sibling.md", "refused"),
        ("..", "refused"),
        ("memory/..", "refused"),
        ("/etc/passwd", "refused"),
        ("/etc/passwd.md", "refused"),
        ("//etc/passwd", "refused"),
        ("/", "refused"),
        (".", "refused"),
        (str(out / "secret.md"), "refused"),
        (str(ws / "SOUL.md"), "refused"),
        (str(ws / "memory") + "/../SOUL.md", "refused"),
        (str(ws / "MEMORY.md"), "ok:evergreen one\nevergreen two"),
        (str(ws / "memory" / "sub" / "b.md"), "ok:beta"),
        ("memory/a.md\x00.txt", "refused"),
        ("\x00", "refused"),
        ("memory/a.md\x00", "refused"),
        ("memory\\..\\SOUL.md", "refused"),
        ("..\\..\\etc\\passwd", "refused"),
        ("memory/..\\..\\SOUL.md", "refused"),
        ("memory/a\x01.md", "refused"),
        ("memory/\na.md", "refused"),
        ("memory/\x7fa.md", "refused"),
        ("memory/\x85a.md", "refused"),
        ("memory/\udcffa.md", "refused"),
        ("memory/" + "a" * 5000 + ".md", "refused"),
        ("memory/" + "a" * 300 + ".md", "refused"),  # one component over NAME_MAX
        ("SOUL.md", "refused"),
        ("notes/n.md", "refused"),
        ("Memory/a.md", "refused"),
        ("MEMORY.MD", "refused"),
        ("memory/notes.txt", "refused"),
        ("MEMORY", "refused"),
        ("memory", "refused"),
        ("memory/pw.md", "refused"),
        ("memory/secret.md", "refused"),
        ("memory/rel-secret.md", "refused"),
        ("memory/out/etc/passwd", "refused"),
        ("memory/out/etc/passwd.md", "refused"),
        ("memory/out" + str(out / "secret.md"), "refused"),
        ("memory/out" + str(ws / "SOUL.md"), "refused"),
        ("memory/out" + str(ws / "MEMORY.md"), "ok:evergreen one\nevergreen two"),
        ("memory/outdir/secret.md", "refused"),
        ("memory/loop.md", "refused"),
        ("memory/loopa.md", "refused"),
        ("memory/loopdir/x.md", "refused"),
        ("memory/fifo.md", "refused"),
        ("memory/d.md", "refused"),
        ("memory/zero.md", "refused"),
        ("memory/soul.md", "refused"),
        ("memory/txt.md", "refused"),
        ("memory/good.md", "ok:evergreen one\nevergreen two"),
        ("memory/subalias/b.md", "ok:beta"),  # in-tree symlink landing on memory/sub/b.md
        ("memory/%2e%2e/SOUL.md", "missing"),
        ("memory/%2e%2e%2fSOUL.md", "missing"),
        ("memory/..%2fSOUL.md", "missing"),
        ("memory/\u2025/SOUL.md", "missing"),  # two-dot leader
        ("memory/\uff0e\uff0e/SOUL.md", "missing"),  # fullwidth full stops
        ("%2e%2e/outside/secret.md", "refused"),
        ("..%2f..%2foutside%2fsecret.md", "refused"),
        ("~/secret.md", "refused"),
        ("~root/.bashrc.md", "refused"),
        ("", "refused"),
        ("   ", "refused"),
        ("../extralink/secret.md", "refused"),  # symlinked extra path is not honoured
        ("../extra/escape.md", "refused"),
        ("../extra/e.md", "ok:extra note"),
        ("../extrafile.md", "ok:extra file"),
        ("./memory/a.md", "ok:alpha"),
        ("memory//sub///b.md", "ok:beta"),
        ("memory/missing.md", "missing"),
        (None, "bad"),
        (1, "bad"),
        (b"MEMORY.md", "bad"),
        (["MEMORY.md"], "bad"),
    ]


def test_hostile_table_is_large() -> None:
    assert len(hostile(Path("/x/ws"))) >= 40


@pytest.mark.timeout(30)
def test_hostile_paths(ws: Path) -> None:
    failures = []
    for path, expected in hostile(ws):
        try:
            r = read_lines(ws, path, extra_paths=extras(ws))  # type: ignore[arg-type]
        except PathRefused as exc:
            got = "refused"
            assert str(exc).startswith("path refused: "), (path, exc)
        except BadRequest:
            got = "bad"
        else:
            assert SECRET not in r.text, (path, r)
            got = "missing" if r.missing else f"ok:{r.text}"
            if r.missing:
                assert r.text == "" and r.lines == 0
        if got != expected:
            failures.append((path if len(str(path)) < 80 else str(path)[:80], expected, got))
    assert failures == []


def test_symlink_inside_workspace_to_allowed_file(ws: Path) -> None:
    # memory/subalias -> sub: the realpath is memory/sub/b.md, an allowed memory file.
    r = read_lines(ws, "memory/subalias/b.md")
    assert (r.path, r.text) == ("memory/subalias/b.md", "beta")


def test_resolve_memory_path(ws: Path) -> None:
    real = Path(os.path.realpath(ws))
    assert resolve_memory_path(ws, "./memory/a.md") == ("memory/a.md", real / "memory" / "a.md")
    assert resolve_memory_path(ws, "MEMORY.md") == ("MEMORY.md", real / "MEMORY.md")
    assert resolve_memory_path(ws, "DREAMS.md")[0] == "DREAMS.md"
    assert resolve_memory_path(ws, "memory.md")[0] == "memory.md"  # allowed even if missing
    assert resolve_memory_path(ws, "memory/x/UPPER.MD")[0] == "memory/x/UPPER.MD"
    assert resolve_memory_path(ws, str(ws / "memory" / "a.md"))[0] == "memory/a.md"
    assert resolve_memory_path(ws, str(real / "memory" / "a.md"))[0] == "memory/a.md"
    assert resolve_memory_path(ws, "memory/good.md") == ("memory/good.md", real / "MEMORY.md")
    assert resolve_memory_path(ws, "  MEMORY.md  ")[0] == "MEMORY.md"


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("memory/../SOUL.md", "'..' is not allowed"),
        ("SOUL.md", "not a memory file"),
        ("memory/x.txt", "only .md files"),
        ("memory/\x00.md", "NUL byte"),
        ("memory/pw.md", "outside the workspace through a symlink"),
        ("memory/soul.md", "not a memory file"),
        ("/etc/passwd", "absolute path outside the workspace"),
        ("memory\\a.md", "backslash"),
        ("~/x.md", "'~'"),
        ("memory/loop.md", "symlink loop"),
    ],
)
def test_refusal_messages(ws: Path, path: str, words: str) -> None:
    with pytest.raises(PathRefused, match="^path refused: .*" + words.replace(".", r"\.")):
        resolve_memory_path(ws, path)


def test_special_files_refused_on_read(ws: Path) -> None:
    with pytest.raises(PathRefused, match="not a regular file"):
        read_lines(ws, "memory/fifo.md")
    with pytest.raises(PathRefused, match="not a regular file"):
        read_lines(ws, "memory/d.md")


def test_extra_paths(ws: Path) -> None:
    ex = extras(ws)
    assert read_lines(ws, "../extra/e.md", extra_paths=ex).text == "extra note"
    assert read_lines(ws, str(ws.parent / "extra" / "e.md"), extra_paths=ex).path == (
        "../extra/e.md"
    )
    assert read_lines(ws, "../extra/nope.md", extra_paths=ex).missing
    with pytest.raises(PathRefused):
        read_lines(ws, "../extra/e.md")  # not configured
    with pytest.raises(PathRefused):
        read_lines(ws, "../sibling.md", extra_paths=ex)  # next to the extra file, not it
    # An extra directory inside the workspace opens non-memory folders, and only those.
    assert read_lines(ws, "notes/n.md", extra_paths=["notes"]).text == f"{SECRET}-NOTES"
    with pytest.raises(PathRefused):
        read_lines(ws, "SOUL.md", extra_paths=["notes"])


def test_toctou_directory_swap_never_reads_outside(ws: Path) -> None:
    inside = write(ws / "memory" / "real" / "x.md", "inside\n").parent
    flip = ws / "memory" / "flip"
    target = ws.parent / "outside"
    write(target / "x.md", f"{SECRET}\n")
    stop = threading.Event()

    def flipper() -> None:
        while not stop.is_set():
            os.rename(inside, flip)
            os.rename(flip, inside)
            os.symlink(target, flip)
            os.unlink(flip)

    t = threading.Thread(target=flipper)
    t.start()
    seen: set[str] = set()
    try:
        for _ in range(3000):
            try:
                r = read_lines(ws, "memory/flip/x.md")
            except PathRefused:
                seen.add("refused")
                continue
            assert SECRET not in r.text
            seen.add("missing" if r.missing else r.text)
    finally:
        stop.set()
        t.join()
    assert seen <= {"refused", "missing", "inside"}


printable_segments = st.sampled_from(
    [
        "..",
        ".",
        "",
        "memory",
        "MEMORY.md",
        "memory.md",
        "DREAMS.md",
        "SOUL.md",
        "a.md",
        "sub",
        "b.md",
        "pw.md",
        "secret.md",
        "rel-secret.md",
        "out",
        "outdir",
        "etc",
        "passwd",
        "loop.md",
        "loopdir",
        "fifo.md",
        "d.md",
        "zero.md",
        "soul.md",
        "good.md",
        "txt.md",
        "subalias",
        "notes",
        "n.md",
        "notes.txt",
        "outside",
        "ws",
        "extra",
        "e.md",
        "extralink",
        "escape.md",
        "extrafile.md",
        "sibling.md",
        "%2e%2e",
        "~",
        "..\\..",
        "\x00",
        "\u2025",
        ".md",
        "x.MD",
    ]
)
md_names = st.sampled_from(
    [
        "MEMORY.md",
        "memory.md",
        "DREAMS.md",
        "SOUL.md",
        "a.md",
        "b.md",
        "pw.md",
        "secret.md",
        "rel-secret.md",
        "loop.md",
        "fifo.md",
        "d.md",
        "zero.md",
        "soul.md",
        "good.md",
        "txt.md",
        "n.md",
        "e.md",
        "escape.md",
        "extrafile.md",
        "sibling.md",
        "passwd.md",
        "x.MD",
    ]
)
segments = st.one_of(
    printable_segments,
    printable_segments,
    printable_segments,
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=6),
)


@st.composite
def hostile_paths(draw: st.DrawFn, base: str) -> str:
    parts = draw(st.lists(segments, max_size=7))
    # End on a .md name most of the time, so the symlink and containment checks get exercised.
    parts.append(draw(st.one_of(md_names, md_names, md_names, segments)))
    joined = "/".join(parts)
    prefix = draw(
        st.sampled_from(
            ["", "", "memory/", "/", "./", base + "/", base + "/ws/", "memory/out" + base]
        )
    )
    return prefix + joined


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_property_never_escapes(shared_ws: Path, data: st.DataObject) -> None:
    base = str(shared_ws.parent)
    path = data.draw(st.one_of(st.text(max_size=40), hostile_paths(base)))
    ex = extras(shared_ws)
    try:
        r = read_lines(shared_ws, path, extra_paths=ex)
    except (PathRefused, BadRequest):
        return
    assert isinstance(r, GetResult)
    assert SECRET not in r.text
    real = os.path.realpath(os.path.join(shared_ws, r.path))
    allowed_roots = [os.path.realpath(shared_ws), os.path.realpath(shared_ws.parent / "extra")]
    assert any(real.startswith(root + os.sep) for root in allowed_roots) or real == (
        os.path.realpath(shared_ws.parent / "extrafile.md")
    )
    if not r.missing:
        with open(real, encoding="utf-8") as f:
            assert r.text in f.read()


# -- line windows -------------------------------------------------------------------------------


@pytest.fixture()
def mem(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "memory").mkdir()
    yield tmp_path


def put(root: Path, name: str, data: str | bytes) -> str:
    p = root / "memory" / name
    if isinstance(data, str):
        data = data.encode("utf-8")
    p.write_bytes(data)
    return f"memory/{name}"


def numbered(n: int) -> str:
    return "".join(f"line{i}\n" for i in range(1, n + 1))


def test_window(mem: Path) -> None:
    rel = put(mem, "n.md", numbered(10))
    r = read_lines(mem, rel, from_line=3, lines=4)
    assert r == GetResult(rel, "line3\nline4\nline5\nline6", 3, 4, False, None, False)
    r = read_lines(mem, rel, from_line=8, lines=10)
    assert (r.text, r.lines, r.truncated, r.next_from) == ("line8\nline9\nline10", 3, False, None)


def test_default_window_is_120_lines(mem: Path) -> None:
    r = read_lines(mem, put(mem, "n.md", numbered(300)))
    assert r.lines == 120 and r.text.splitlines()[-1] == "line120"


def test_budget_drops_lines_from_the_end(mem: Path) -> None:
    rel = put(mem, "n.md", "0123456789\n" * 10)
    r = read_lines(mem, rel, from_line=2, lines=5, max_chars=35)
    assert (r.text, r.lines, r.truncated, r.next_from) == (
        "0123456789\n" * 2 + "0123456789",
        3,
        True,
        5,
    )
    exact = read_lines(mem, rel, lines=3, max_chars=32)  # 3 * 10 chars + 2 newlines
    assert (exact.lines, exact.truncated, exact.next_from) == (3, False, None)
    over = read_lines(mem, rel, lines=4, max_chars=32)
    assert (over.lines, over.truncated, over.next_from) == (3, True, 4)


def test_hard_cut_of_a_long_first_line(mem: Path) -> None:
    rel = put(mem, "n.md", "x" * 50 + "\nnext\n")
    r = read_lines(mem, rel, max_chars=20)
    assert (r.text, r.lines, r.truncated, r.next_from) == ("x" * 20, 1, True, 2)
    r = read_lines(mem, rel, from_line=2, max_chars=20)
    assert (r.text, r.truncated) == ("next", False)
    # A long line after the first is dropped, not cut.
    rel = put(mem, "m.md", "short\n" + "y" * 50 + "\n")
    r = read_lines(mem, rel, max_chars=20)
    assert (r.text, r.lines, r.truncated, r.next_from) == ("short", 1, True, 2)


def test_hard_cut_of_a_huge_line_and_multibyte(mem: Path) -> None:
    rel = put(mem, "big.md", "é" * 3_000_000 + "\ntail\n")
    r = read_lines(mem, rel)
    assert (r.text, r.truncated, r.next_from) == ("é" * 12_000, True, 2)
    assert read_lines(mem, rel, from_line=2).text == "tail"
    rel = put(mem, "cjk.md", "漢字かな" * 10 + "\n")
    assert read_lines(mem, rel, max_chars=5).text == "漢字かな漢"


def test_crlf_and_invalid_utf8(mem: Path) -> None:
    rel = put(mem, "crlf.md", b"a\r\nb\r\nc\rd\r\n\r\n")
    r = read_lines(mem, rel)
    assert (r.text, r.lines) == ("a\nb\nc\rd\n", 4)
    rel = put(mem, "bad.md", b"ok \xff\xfe end\n")
    assert read_lines(mem, rel).text == "ok \ufffd\ufffd end"


def test_no_trailing_newline_and_empty_file(mem: Path) -> None:
    rel = put(mem, "n.md", "one\ntwo")
    r = read_lines(mem, rel)
    assert (r.text, r.lines) == ("one\ntwo", 2)
    r = read_lines(mem, put(mem, "e.md", ""))
    assert r == GetResult("memory/e.md", "", 1, 0, False, None, False)


def test_from_past_the_end(mem: Path) -> None:
    rel = put(mem, "n.md", numbered(3))
    for start in (4, 5, 10**6):
        r = read_lines(mem, rel, from_line=start)
        assert r == GetResult(rel, "", start, 0, False, None, False)


def test_missing_allowed_file_is_empty(mem: Path) -> None:
    for path in ("MEMORY.md", "memory.md", "DREAMS.md", "memory/none.md", "memory/a/b/c.md"):
        r = read_lines(mem, path, from_line=5)
        assert r == GetResult(path, "", 5, 0, False, None, True)
    put(mem, "file.md", "x\n")
    assert read_lines(mem, "memory/file.md/inner.md").missing
    assert read_lines(mem / "no-such-workspace", "MEMORY.md").missing


@pytest.mark.parametrize(
    ("kw", "bad"),
    [
        ({"from_line": 0}, "from"),
        ({"from_line": -1}, "from"),
        ({"from_line": True}, "from"),
        ({"from_line": "1"}, "from"),
        ({"from_line": 1.5}, "from"),
        ({"lines": 0}, "lines"),
        ({"lines": 10_001}, "lines"),
        ({"lines": None}, "lines"),
        ({"max_chars": 0}, "max_chars"),
    ],
)
def test_bad_window_arguments(mem: Path, kw: dict[str, object], bad: str) -> None:
    put(mem, "n.md", "x\n")
    with pytest.raises(BadRequest, match=f"^{bad} "):
        read_lines(mem, "memory/n.md", **kw)  # type: ignore[arg-type]
    assert read_lines(mem, "memory/n.md", lines=10_000).lines == 1


def test_large_file_read_near_the_start(mem: Path) -> None:
    rel = put(mem, "huge.md", numbered(200_000))
    r = read_lines(mem, rel, from_line=5, lines=3)
    assert (r.text, r.lines, r.truncated) == ("line5\nline6\nline7", 3, False)
    r = read_lines(mem, rel, from_line=199_999, lines=5)
    assert (r.text, r.lines) == ("line199999\nline200000", 2)


def test_unreadable_allowed_file_is_refused(mem: Path) -> None:
    p = mem / "memory" / "locked.md"
    p.write_text("x\n")
    p.chmod(0)
    try:
        try:
            os.close(os.open(p, os.O_RDONLY))
        except PermissionError:
            pass
        else:
            pytest.skip(f"euid {os.geteuid()} can read a mode-0 file")
        with pytest.raises(PathRefused, match="permission denied"):
            read_lines(mem, "memory/locked.md")
    finally:
        p.chmod(0o644)
