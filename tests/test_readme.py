"""The README's promises about set-up: short, two commands first, and CI runs exactly the test
one."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def first_code_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```\w*\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_readme_starts_with_exactly_two_commands():
    assert first_code_block() == ["make demo", "make test"]


def test_readme_is_short_and_links_into_the_docs():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for page in re.findall(r"\]\((docs/[\w-]+\.md)", text):
        assert (ROOT / page).is_file(), page
    assert "docs/getting-started.md" in text


def test_ci_runs_exactly_the_readme_test_command():
    ci = [l for l in (ROOT / ".ci" / "run").read_text().splitlines()
          if l.strip() and not l.lstrip().startswith("#")]
    assert ci[-1].strip() == first_code_block()[1]


def test_torch_is_pinned_by_the_constraints_both_commands_use():
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text().splitlines()
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()


def test_architecture_tree_names_every_stage_folder():
    section = (ROOT / "docs" / "architecture.md").read_text()
    folders = {p.parent.name for p in (ROOT / "mha_export").glob("*/__init__.py")}
    assert folders == {"layer", "weights", "graph", "kinds", "lossy", "comparison", "targets",
                       "export", "check", "bench", "model", "fanout", "cli"}
    for name in folders:
        assert f"  {name}/" in section, name
    for where in ("graph/forms/", "check/runners/", "weights/families/", "targets/registry.py"):
        assert where in section, where


def test_readme_names_every_gguf_architecture_read():
    from mha_export.weights.gguf import ARCHITECTURES
    row = next(line for line in (ROOT / "README.md").read_text().splitlines()
               if line.startswith("| GGUF files |"))
    named = re.findall(r"`([\w.-]+)`", row.split(";")[0])
    assert sorted(named) == sorted(ARCHITECTURES)
