"""Config precedence (argument > environment > file > default) and errors that name the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memd.config import Config
from memd_client.errors import ConfigError


def write_config(home: Path, text: str) -> Path:
    path = home / "config" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_and_memd_home(memd_home: Path) -> None:
    c = Config.load()
    assert c.source == f"defaults: no file at {memd_home / 'config' / 'config.toml'}"
    assert (c.index.chunk_tokens, c.index.chunk_overlap) == (400, 80)
    assert (c.search.max_results, c.search.min_score, c.search.mode) == (6, 0.35, "hybrid")
    assert c.watch.debounce_ms == 1500
    assert c.index_dir == memd_home / "state" / "indexes"
    assert c.config_file == memd_home / "config" / "config.toml"
    assert c.dirs.runtime == memd_home / "run"


def test_xdg_directories_without_memd_home(tmp_path: Path) -> None:
    env = {
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "XDG_STATE_HOME": str(tmp_path / "st"),
        "XDG_RUNTIME_DIR": str(tmp_path / "rt"),
    }
    c = Config.load(env=env)
    assert c.config_file == tmp_path / "cfg" / "memd" / "config.toml"
    assert c.index_dir == tmp_path / "st" / "memd" / "indexes"
    assert c.dirs.runtime == tmp_path / "rt" / "memd" and c.dirs.runtime_private


def test_precedence_argument_env_file_default(
    memd_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(
        memd_home, "[search]\nmax_results = 3\nmin_score = 0.5\n[index]\nsqlite_vec = false\n"
    )
    c = Config.load()
    assert (c.search.max_results, c.search.min_score, c.index.sqlite_vec) == (3, 0.5, False)
    assert c.source.endswith("config.toml")
    monkeypatch.setenv("MEMD_SEARCH_MAX_RESULTS", "9")
    monkeypatch.setenv("MEMD_INDEX_SQLITE_VEC", "yes")
    c = Config.load()
    assert (c.search.max_results, c.search.min_score, c.index.sqlite_vec) == (9, 0.5, True)
    c = Config.load(search__max_results=12)
    assert c.search.max_results == 12


def test_workspaces_and_aliases(memd_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(memd_home, '[[workspaces]]\npath = "~/a"\nname = "a"\nextra_paths = ["notes"]\n')
    monkeypatch.setenv("MEMD_LOCAL_MODEL", "/models/x.gguf")
    monkeypatch.setenv("MEMD_TIMEZONE", "Asia/Tokyo")
    c = Config.load()
    assert c.workspaces[0].path == "~/a" and c.workspaces[0].extra_paths == ("notes",)
    assert c.embedding.model_path == "/models/x.gguf"
    assert c.timezone == "Asia/Tokyo"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[search]\nmax_reslts = 3\n", "unknown key search.max_reslts"),
        ("bogus = 1\n", "unknown key bogus"),
        ("[search]\nmax_results = 'six'\n", "search.max_results must be a whole number"),
        ("[search]\nmax_results = 0\n", "search.max_results must be from 1 to 100"),
        ("[search]\nmode = 'fuzzy'\n", "search.mode must be one of hybrid, keyword, vector"),
        ("[search]\nmin_score = 2\n", "search.min_score must be from 0 to 1"),
        ("[index]\nchunk_overlap = 400\n", "index.chunk_overlap must be at least 0 and below"),
        ("[index]\nsqlite_vec = 'yes'\n", "index.sqlite_vec must be true or false"),
        ("[embedding]\nprovider = 'magic'\n", "embedding.provider must be one of"),
        ("search = 3\n", "[search] must be a table"),
        ("[[workspaces]]\nname = 'x'\n", "workspaces[0].path is required"),
        ("[[workspaces]]\npath = 'x'\ncolour = 1\n", "unknown key workspaces[0].colour"),
        ("timezone = 'Mars/Olympus'\n", "not a known IANA time zone"),
        ("[search\n", "config.toml"),
    ],
)
def test_bad_files_name_the_key(memd_home: Path, toml: str, message: str) -> None:
    write_config(memd_home, toml)
    with pytest.raises(ConfigError) as err:
        Config.load()
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("MEMD_SEARCH_MAX_RESULTZ", "3", "unknown variable MEMD_SEARCH_MAX_RESULTZ"),
        ("MEMD_SEARCH_MIN_SCORE", "high", "MEMD_SEARCH_MIN_SCORE must be a number"),
        ("MEMD_INDEX_SQLITE_VEC", "maybe", "MEMD_INDEX_SQLITE_VEC must be true or false"),
    ],
)
def test_bad_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, message: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=message):
        Config.load()


def test_unrelated_memd_variables_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMD_TEST_MODEL", "/somewhere/model.gguf")
    assert Config.load().search.max_results == 6


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Config.load(tmp_path / "nope.toml")


def test_config_is_frozen() -> None:
    c = Config.load()
    with pytest.raises(AttributeError):
        c.search.max_results = 3  # type: ignore[misc]


HOSTILE = Path(__file__).with_name("hostile") / "config.toml.txt"


def hostile_snippets() -> list[str]:
    lines = HOSTILE.read_text(encoding="utf-8").splitlines()
    return [line.replace("\\n", "\n") for line in lines if line and not line.startswith("#")]


@pytest.mark.parametrize("snippet", hostile_snippets())
def test_out_of_range_values_are_refused_naming_the_key(tmp_path: Path, snippet: str) -> None:
    file = tmp_path / "config.toml"
    file.write_text(snippet + "\n")
    section = snippet.split("]")[0].strip("[")
    key = snippet.split("\n")[1].split("=")[0].strip()
    with pytest.raises(ConfigError, match=rf"{section}\.{key}"):
        Config.load(file)


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "1e999"])
def test_non_finite_numbers_from_the_environment(value: str) -> None:
    with pytest.raises(ConfigError, match="MEMD_SEARCH_VECTOR_WEIGHT|search.vector_weight"):
        Config.load(env={"MEMD_SEARCH_VECTOR_WEIGHT": value})


def test_config_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    """MEMD_CONFIG=/dev/zero used to hang start-up reading forever."""
    with pytest.raises(ConfigError, match="not a regular file"):
        Config.load(env={"MEMD_CONFIG": "/dev/zero"})
    with pytest.raises(ConfigError, match="not a regular file"):
        Config.load(tmp_path)  # a directory
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        Config.load(fifo)
    big = tmp_path / "big.toml"
    big.write_text("# padding\n" * 200_000)
    with pytest.raises(ConfigError, match="larger than"):
        Config.load(big)


# Files no check of a value foresees: each must be a ConfigError naming the file (a start exits
# with one line, a reload keeps the old configuration), never another exception.
UNREADABLE_FILES = {
    "nested arrays": b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "nested tables": b"x = " + b"{a = " * 3000 + b"1" + b"}" * 3000 + b"\n",
    "nested in a section": b"[index]\nchunk_tokens = " + b"[" * 3000 + b"]" * 3000 + b"\n",
    "integer of 5000 digits": b"[index]\nchunk_tokens = " + b"9" * 5000 + b"\n",
    "integer beyond any float": b"[search]\nmin_score = " + b"9" * 400 + b"\n",
    "not UTF-8": b'timezone = "\xff\xfe"\n',
    "many workspaces": b"".join(b'[[workspaces]]\npath = "/w%d"\n' % i for i in range(5000)),
    "many extra paths": b'[[workspaces]]\npath = "/w"\nextra_paths = ['
    + b", ".join(b'"n%d"' % i for i in range(5000))
    + b"]\n",
    "many scopes": b'[[scopes]]\naction = "allow"\n' * 5000,
    "a key of 500,000 characters": b"[index]\n" + b"k" * 500_000 + b" = 1\n",
    "a NUL in a path": b'[embedding]\nmodel_path = "a\\u0000b"\n',
    "a time zone that is a folder": b'timezone = "Europe"\n',
}


@pytest.mark.parametrize("what", list(UNREADABLE_FILES))
def test_any_file_is_a_config_error_naming_it(tmp_path: Path, what: str) -> None:
    file = tmp_path / "config.toml"
    file.write_bytes(UNREADABLE_FILES[what])
    with pytest.raises(ConfigError) as err:
        Config.load(file)
    message = str(err.value)
    assert str(file) in message
    assert "\n" not in message and len(message) < 400, message


def test_a_directory_or_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is not a regular file"):
        Config.load(tmp_path)
    inside = tmp_path / "file"
    inside.write_text("")
    with pytest.raises(ConfigError, match="cannot be read: Not a directory"):
        Config.load(inside / "config.toml")  # a path through a file
    if os.geteuid() != 0:  # root reads any file
        locked = tmp_path / "locked.toml"
        locked.write_text("[search]\nmax_results = 3\n")
        locked.chmod(0)
        with pytest.raises(ConfigError, match=f"{locked} cannot be read: Permission denied"):
            Config.load(locked)


def test_a_bad_value_says_where_it_came_from(tmp_path: Path) -> None:
    file = tmp_path / "config.toml"
    file.write_text("[search]\nmax_results = 0\n")
    with pytest.raises(ConfigError, match=f"^{file}: search.max_results must be from 1 to 100"):
        Config.load(file)
    with pytest.raises(ConfigError, match="^MEMD_SEARCH_MAX_RESULTS: search.max_results must"):
        Config.load(file, env={"MEMD_SEARCH_MAX_RESULTS": "500"})
