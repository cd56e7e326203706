"""One version: the package's ``__version__`` is the only place it is written; pyproject.toml
reads it, `mha-export --version` prints it, every artifact's and report's ``versions`` carry it,
and it is the changelog's newest release."""
import re
import tomllib
from pathlib import Path

from click.testing import CliRunner

import mha_export
from mha_export.cli.commands import cli
from mha_export.env import versions

ROOT = Path(__file__).resolve().parents[1]
RELEASE = re.compile(r"## (\d+)\.(\d+)\.(\d+) — (\d{4}-\d{2}-\d{2})")


def releases() -> list[tuple[tuple[int, int, int], str]]:
    """The changelog's version headings, in order: ((major, minor, patch), date); each one
    either "Unreleased" (first only) or a dated release."""
    headings = [line for line in (ROOT / "CHANGELOG.md").read_text().splitlines()
                if line.startswith("## ")]
    if headings and headings[0] == "## Unreleased":
        headings = headings[1:]
    out = []
    for heading in headings:
        found = RELEASE.fullmatch(heading)
        assert found, f"not a dated release heading: {heading!r}"
        out.append((tuple(int(n) for n in found.groups()[:3]), found.group(4)))
    return out


def test_the_version_is_the_changelogs_newest_release_and_what_the_cli_says():
    version = mha_export.__version__
    newest, _ = releases()[0]
    assert ".".join(map(str, newest)) == version
    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"mha-export, version {version}"
    assert versions()["mha-export"] == version  # an editable install's metadata may lag


def test_pyproject_reads_the_packages_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "mha_export.__version__"}


def test_releases_are_newest_first():
    found = releases()
    assert [v for v, _ in found] == sorted((v for v, _ in found), reverse=True)
    assert [d for _, d in found] == sorted((d for _, d in found), reverse=True)
    assert len({v for v, _ in found}) == len(found)
