"""The console examples of README.md and docs/*.md, run as written: every line they show is what the command prints
today (paths shortened to "..." compare by their ends; a line of "..." stands for lines left out). The README shows
the first command's output first, then the decisions (a plan and a framework's tuning); the docs show the rest
(the generic threshold search, a plan at fixed counts, a plan reached with 90 % confidence)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from simfog import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(page.relative_to(ROOT), command, shown) for page in PAGES
          for command, shown in re.findall(r"```console\n\$ (simfog [^\n]*)\n(.*?)```", page.read_text(), re.S)]
WRITES_FILES = ("tune", "plan", "curve", "sweep")  # given -o, so that nothing lands in the repository


def test_the_readme_shows_the_first_command_then_the_decisions():
    readme = [command for page, command, _ in BLOCKS if page.name == "README.md"]
    assert readme[0] == "simfog simulate"  # the first command and its output come first
    assert any(c.startswith("simfog plan ") and "--target-samples-per-s" in c for c in readme)
    assert any(c.startswith("simfog tune ") and "--merge ddp" in c for c in readme)
    docs = [command for page, command, _ in BLOCKS if page.name != "README.md"]
    assert any("--confidence" in c for c in docs) and any(c.startswith("simfog tune ") and "--merge" not in c
                                                          for c in docs)


@pytest.mark.parametrize("page, command, shown", BLOCKS, ids=[f"{p}:{c[7:60]}" for p, c, _ in BLOCKS])
def test_console_block_is_what_the_command_prints(page, command, shown, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)[1:]
    if argv[0] in WRITES_FILES:
        argv += ["-o", str(tmp_path / "out")]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    for line in shown.strip().splitlines():
        head, dots, tail = line.partition("...")
        assert any(p.startswith(head) and p.endswith(tail) for p in printed) if dots else line in printed, line
