"""What is published: every package of the tree in the distribution, under a name of our own,
with install hints that name it and work from a checkout too."""

from __future__ import annotations

import tomllib
from pathlib import Path

from memd.dist import DISTRIBUTION, install_hint

ROOT = Path(__file__).resolve().parent.parent


def _project() -> dict:  # type: ignore[type-arg]
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_every_package_of_the_tree_is_in_the_distribution() -> None:
    listed = set(_project()["tool"]["setuptools"]["packages"])
    tree = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "memd").rglob("__init__.py")
    }
    tree |= {
        ".".join(init.parent.relative_to(ROOT / "client").parts)
        for init in (ROOT / "client" / "memd_client").rglob("__init__.py")
    }
    assert listed == tree, f"missing: {sorted(tree - listed)}; extra: {sorted(listed - tree)}"


def test_the_distribution_has_a_name_of_its_own_and_an_spdx_license() -> None:
    project = _project()["project"]
    # "memd" and "memctl" on PyPI are unrelated projects: a hint naming them installs those.
    assert project["name"] == DISTRIBUTION not in ("memd", "memctl")
    assert project["license"] == "MIT"  # an SPDX expression: a table stops building in 2027
    assert (ROOT / "LICENSE").is_file()
    assert set(project["scripts"]) == {"memd", "memctl"}


def test_install_hints_name_the_distribution_and_the_checkout_form() -> None:
    hint = install_hint("local")
    assert f"pip install '{DISTRIBUTION}[local]'" in hint
    assert "pip install -e '.[local]'" in hint
    assert DISTRIBUTION in install_hint() and "pip install -e ." in install_hint()


def test_no_hint_names_a_strangers_package() -> None:
    strangers = ("'memd[", '"memd[', "install memd ", "install memctl")
    offenders = [
        f"{path.relative_to(ROOT)}: {needle}"
        for folder in ("memd", "client", "integrations/openclaw/src", "docs")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".js", ".md") and path.is_file()
        for needle in strangers
        if needle in path.read_text(encoding="utf-8", errors="replace")
    ]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    offenders += [f"README.md: {n}" for n in strangers if n in readme]
    assert not offenders
