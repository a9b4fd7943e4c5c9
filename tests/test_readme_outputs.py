"""README's console examples of decisions under uncertainty, run as written: every line the README shows is what
the command prints today (paths shortened to "..." in the README compare by their ends)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from simfog import cli

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```console\n\$ (simfog (?:tune|plan) [^\n]*)\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _cases():
    return [(cmd, out) for cmd, out in BLOCKS if "--confidence" in cmd or "tune" in cmd]


def test_the_readme_shows_the_decisions():
    assert len(_cases()) == 3


@pytest.mark.parametrize("command, shown", _cases(), ids=["tune-ddp", "tune", "plan"])
def test_readme_console_block_is_what_the_command_prints(command, shown, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)[1:] + ["-o", str(tmp_path / "out")]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    for line in shown.strip().splitlines():
        head, dots, tail = line.partition("...")
        assert any(p.startswith(head) and p.endswith(tail) for p in printed) if dots else line in printed, line
