"""One output convention for every command: `-o` names a folder where a command writes several files (tune, plan,
curve: DIR/tune.csv, DIR/tune.png, ...; the names a default run folder holds), a file where it writes one (sweep's
CSV, import's trace). Without -o, a new folder simfog-out/<command>-<UTC time>/."""

from __future__ import annotations

from pathlib import Path

from simfog.errors import ConfigError


def folder_prefix(output: str, command: str) -> str:
    """The path prefix of `command`'s files in the folder `output` (made when they are written). Raises ConfigError
    naming -o when `output` is an existing file."""
    folder = Path(output)
    if folder.exists() and not folder.is_dir():
        raise ConfigError("-o", output, f"a folder for {command}'s files (this is a file); -o names a folder where a "
                          "command writes several files")
    return str(folder / command)
