"""The code itself: strict typing, lint, and the import layering of the packages."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which(tool, path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[test]')")
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_mypy_strict() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_benchmarks() -> None:
    # The benchmark scripts are not a package; they are checked as files, as strictly.
    scripts = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bench").glob("*.py"))
    result = _run("mypy", *scripts)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff() -> None:
    result = _run("ruff", "check", "memd", "client", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_layers() -> None:
    result = _run("lint-imports")
    assert result.returncode == 0, result.stdout + result.stderr


def _module_sizes() -> dict[str, int]:
    """Lines of every module of memd and its client, by path."""
    sizes = {}
    for path in sorted([*(ROOT / "memd").rglob("*.py"), *(ROOT / "client").rglob("*.py")]):
        with path.open("rb") as f:
            sizes[str(path.relative_to(ROOT))] = sum(1 for _ in f)
    return sizes


def test_the_size_rule() -> None:
    """No module over 500 lines and at most five over 400: a module that grows past them has
    more than one job, and is split by what it does (docs/architecture.md)."""
    sizes = _module_sizes()
    assert sizes["memd/service.py"] > 0 and "client/memd_client/connection.py" in sizes
    over_500 = {name: n for name, n in sizes.items() if n > 500}
    over_400 = {name: n for name, n in sizes.items() if n > 400}
    assert over_500 == {}, f"over 500 lines: {over_500}"
    assert len(over_400) <= 5, f"{len(over_400)} modules over 400 lines (at most 5): {over_400}"


def test_long_modules_say_why() -> None:
    """A module over 400 lines says in its docstring why it is one module ("Over 400 lines:")."""
    quiet = []
    for path in sorted([*(ROOT / "memd").rglob("*.py"), *(ROOT / "client").rglob("*.py")]):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > 400 and "Over 400 lines" not in text[:3000]:
            quiet.append(str(path.relative_to(ROOT)))
    assert quiet == [], f"over 400 lines without saying why: {quiet}"
