"""Session transcripts: names, listing, rendering to User/Assistant text, delta thresholds, windows."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from memd.sessions import (
    Rendered,
    is_archived,
    is_transcript_name,
    list_transcripts,
    map_lines,
    read_jsonl_lines,
    render,
)

TS_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def msg(role: str, content: object, **extra: object) -> dict[str, object]:
    message: dict[str, object] = {"role": role, "content": content}
    message.update(extra)
    return {"type": "message", "message": message}


def jsonl(*records: object) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode(
        "utf-8"
    )


def write(path: Path, *records: object) -> Path:
    path.write_bytes(jsonl(*records))
    return path


# --- names and listing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "transcript", "archived"),
    [
        ("a.jsonl", True, False),
        ("3f1c-uuid.jsonl", True, False),
        ("a.jsonl.reset.2026-01-01T00:00:00Z", True, True),
        ("a.jsonl.deleted.123", True, True),
        ("a.jsonl.reset.2026-01-01T00-00-00.000Z", True, True),
        ("a.json", False, False),
        ("a.jsonl.bak", False, False),
        (".a.jsonl.swp", False, False),
        ("a.jsonl.reset.", False, False),
        ("a.jsonl.deleted", False, False),
        ("sessions.json", False, False),
        ("a.jsonl.tmp.1", False, False),
        ("x/a.jsonl", False, False),
    ],
)
def test_names(name: str, transcript: bool, archived: bool) -> None:
    assert is_transcript_name(name) is transcript
    assert is_archived(name) is archived


def test_list_transcripts_regular_files_only(tmp_path: Path) -> None:
    d = tmp_path / "sessions"
    d.mkdir()
    (d / "b.jsonl").write_bytes(b"{}\n")
    (d / "a.jsonl.deleted.123").write_bytes(b"")
    (d / "notes.json").write_bytes(b"{}")
    (d / "dir.jsonl").mkdir()
    (d / "link.jsonl").symlink_to(d / "b.jsonl")
    files, complete = list_transcripts(d)
    assert complete
    assert [f.name for f in files] == ["a.jsonl.deleted.123", "b.jsonl"]
    b = files[1]
    assert b.abs == d / "b.jsonl" and b.size == 3 and not b.archived
    assert b.mtime_ns == os.stat(d / "b.jsonl").st_mtime_ns
    assert files[0].archived


def test_list_transcripts_missing_and_unreadable(tmp_path: Path) -> None:
    assert list_transcripts(tmp_path / "nope") == ([], True)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert list_transcripts(loop) == ([], False)  # ELOOP: cannot tell what is there
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "a.jsonl").write_bytes(b"")
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running with privileges that ignore permissions")
        assert list_transcripts(locked) == ([], False)
    finally:
        locked.chmod(0o755)


# --- rendering -----------------------------------------------------------------------------


def test_string_and_block_content() -> None:
    r = render(
        jsonl(
            msg("user", "Where is the config?"),
            msg(
                "assistant",
                [
                    {"type": "text", "text": "It lives in"},
                    {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "x"}},
                    {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
                    {"type": "text", "text": "~/.config/memd."},
                ],
            ),
        )
    )
    assert r.text == "User: Where is the config?\nAssistant: It lives in ~/.config/memd."
    assert r.line_map == [1, 2]


def test_only_user_and_assistant_messages() -> None:
    r = render(
        jsonl(
            {"type": "session", "id": "s1", "cwd": "/tmp"},
            msg("system", "You are helpful."),
            msg("user", "hi"),
            msg("tool", "tool output"),
            {"type": "message", "message": {"role": "toolResult", "content": "x"}},
            {"type": "custom", "message": {"role": "user", "content": "not a message record"}},
            {"type": "message", "message": {"role": ["user"], "content": "odd role"}},
            {"type": "message", "message": "not an object"},
            msg("assistant", [{"type": "tool_use", "name": "x"}]),  # no text at all
            msg("assistant", "hello"),
        )
    )
    assert r.text == "User: hi\nAssistant: hello"
    assert r.line_map == [3, 10]


def test_broken_and_blank_lines_keep_the_line_map() -> None:
    data = jsonl(
        msg("user", "one"),
        "",
        "{not json",
        "   ",
        "[1, 2, 3]",
        '"just a string"',
        "NaN",
        msg("assistant", "two"),
    )
    data += b'{"type": "message", "message": {"role": "user", "content": "three"}}\r\n'
    data += b'{"type": "message", "message": {"role": "user", "content": "tru'  # cut off
    r = render(data)
    assert r.text == "User: one\nAssistant: two\nUser: three"
    assert r.line_map == [1, 8, 9]


def test_whitespace_is_collapsed() -> None:
    r = render(
        jsonl(
            msg("user", "  first line\n\n  second\tline \r\n third  "),
            msg("assistant", [{"type": "text", "text": "a\n"}, {"type": "text", "text": "\n b"}]),
            msg("assistant", " \n\t "),
            msg("assistant", [{"type": "text", "text": ""}]),
        )
    )
    assert r.text == "User: first line second line third\nAssistant: a b"
    assert r.line_map == [1, 2]


def test_invalid_utf8_and_lone_surrogates_are_replaced() -> None:
    data = b'{"type":"message","message":{"role":"user","content":"caf\xff \\ud800 ok"}}\n'
    r = render(data)
    assert r.text == "User: caf\ufffd \ufffd ok"
    r.text.encode("utf-8")  # storable


def test_timestamps() -> None:
    r = render(
        jsonl(
            msg("user", "seconds", timestamp=TS_MS // 1000),
            msg("user", "millis", timestamp=TS_MS),
            msg("user", "iso", timestamp="2026-01-01T00:00:00.000Z"),
            msg("user", "iso offset", timestamp="2026-01-01T01:00:00+01:00"),
            {**msg("user", "record level"), "timestamp": "2026-01-01T00:00:00Z"},
            {**msg("user", "message wins", timestamp=TS_MS + 5), "timestamp": TS_MS},
            {**msg("user", "bad message ts", timestamp="soon"), "timestamp": TS_MS},
            msg("user", "missing"),
            msg("user", "garbage", timestamp="yesterday"),
            msg("user", "bool", timestamp=True),
            msg("user", "negative", timestamp=-5),
            msg("user", "fractional seconds", timestamp=1_767_225_600.25),
        )
    )
    assert r.timestamps == [
        TS_MS,
        TS_MS,
        TS_MS,
        TS_MS,
        TS_MS,
        TS_MS + 5,
        TS_MS,
        0,
        0,
        0,
        0,
        TS_MS + 250,
    ]


@pytest.mark.parametrize(
    "marker",
    [
        {
            "type": "custom",
            "customType": "openclaw:bootstrap-context:full",
            "data": {"runId": "dreaming-narrative-light-1775894400455", "sessionId": "d1"},
        },
        {"type": "custom", "runId": "dreaming-narrative-rem-1"},
        {"type": "session", "sessionKey": "agent:main:dreaming-narrative-light-1"},
        {"type": "custom", "data": {"sessionKey": "agent:main:dreaming-narrative-x"}},
        msg(
            "user",
            [{"type": "text", "text": "Write a dream diary entry from these memory fragments."}],
        ),
    ],
)
def test_dreaming_narrative_stops_the_transcript(marker: dict[str, object]) -> None:
    r = render(
        jsonl(msg("user", "before"), marker, msg("user", "after"), msg("assistant", "diary"))
    )
    assert r.text == "User: before"
    assert r.line_map == [1]
    assert r.dreaming_narrative


def test_dreaming_bootstrap_first_excludes_everything() -> None:
    r = render(
        jsonl(
            {
                "type": "custom",
                "customType": "openclaw:bootstrap-context:full",
                "data": {"runId": "dreaming-narrative-light-1"},
            },
            msg("user", "fragments"),
            msg("assistant", "I walked through a library of glass."),
        )
    )
    assert (r.text, r.line_map, r.timestamps) == ("", [], [])
    assert not render(jsonl(msg("user", "a normal chat about dreaming"))).dreaming_narrative


def test_hash_matches_the_reference_formula() -> None:
    r = render(jsonl(msg("user", "a", timestamp=TS_MS), "", msg("assistant", "b")))
    expected = hashlib.sha256(f"{r.text}\n1,3\n{TS_MS},0".encode()).hexdigest()
    assert r.hash == expected
    empty = render(b"")
    assert empty == Rendered("", [], [], hashlib.sha256(b"\n\n").hexdigest())


def test_hash_stable_and_sensitive() -> None:
    base = [msg("user", "hello", timestamp=1), msg("assistant", "world")]
    h = render(jsonl(*base)).hash
    assert render(jsonl(*base)).hash == h
    # Ignored content and extra whitespace do not change the rendering, so not the hash.
    tool = msg("tool", "ignored")
    assert render(jsonl(base[0], msg("assistant", "  world \n"))).hash == h
    assert render(jsonl(*base) + b"\n\n").hash == h
    assert render(jsonl(msg("user", "hello", timestamp=1), msg("assistant", "World"))).hash != h
    assert render(jsonl(tool, *base)).hash != h  # line numbers moved
    assert render(jsonl(msg("user", "hello", timestamp=2), base[1])).hash != h


def test_redact_sees_the_message_lines_then_its_rendered_line() -> None:
    seen: list[str] = []

    def redact(text: str) -> str:
        seen.append(text)
        return text.replace("sk-secret123", "***").replace("DROP", "")

    r = render(
        jsonl(msg("user", "key\n  sk-secret123 ok"), msg("assistant", "DROP")), redact=redact
    )
    assert seen == ["key\n  sk-secret123 ok", "key *** ok", "DROP"]
    assert r.text == "User: key *** ok"
    assert r.line_map == [1]
    newline = render(jsonl(msg("user", "a b")), redact=lambda t: t.replace(" ", "\n\n"))
    assert newline.text == "User: a b"


def test_map_lines() -> None:
    line_map = [2, 5, 6, 9]
    assert map_lines(line_map, 1, 1) == (2, 2)
    assert map_lines(line_map, 2, 4) == (5, 9)
    assert map_lines(line_map, 0, 99) == (2, 9)
    assert map_lines(line_map, 4, 2) == (9, 9)
    assert map_lines([], 3, 4) == (3, 4)


# --- raw JSONL windows ---------------------------------------------------------------------


def test_read_jsonl_lines_windows(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"l1\r\nl2\nl3\n\nl5")
    assert read_jsonl_lines(path, 1, 2, 1000) == ("l1\nl2", 2, False, None)
    assert read_jsonl_lines(path, 3, 10, 1000) == ("l3\n\nl5", 3, False, None)
    assert read_jsonl_lines(path, 6, 10, 1000) == ("", 0, False, None)
    assert read_jsonl_lines(path, 99, 1, 1000) == ("", 0, False, None)


def test_read_jsonl_lines_budget(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"aaaa\nbbbb\ncccc\n" + b"z" * 50_000 + b"\nend\n")
    assert read_jsonl_lines(path, 1, 10, 9) == ("aaaa\nbbbb", 2, True, 3)
    assert read_jsonl_lines(path, 1, 10, 14) == ("aaaa\nbbbb\ncccc", 3, True, 4)
    assert read_jsonl_lines(path, 4, 1, 10) == ("z" * 10, 1, True, 5)
    assert read_jsonl_lines(path, 5, 1, 10) == ("end", 1, False, None)


def test_read_jsonl_lines_refusals(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"x\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    with pytest.raises(OSError):
        read_jsonl_lines(link, 1, 1, 10)
    with pytest.raises(FileNotFoundError):
        read_jsonl_lines(tmp_path / "missing.jsonl", 1, 1, 10)
    with pytest.raises(ValueError):
        read_jsonl_lines(path, 0, 1, 10)
    with pytest.raises(ValueError):
        read_jsonl_lines(tmp_path, 1, 1, 10)
