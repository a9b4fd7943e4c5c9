"""One output convention for every command: `-o` names a folder where a command writes several files (tune, plan,
curve: DIR/tune.csv, DIR/tune.png, ...; the names a default run folder holds), a file where it writes one (sweep's
CSV, import's trace). Without -o, a new folder simfog-out/<command>-<UTC time>/."""

from __future__ import annotations

from simfog.errors import ConfigError
from simfog.files import output_kind, output_name


def folder_prefix(output: str, command: str) -> str:
    """The path prefix of `command`'s files in the folder `output` (made when they are written). Raises ConfigError
    naming -o when `output` is no folder name (empty, too long: simfog.files.output_name) or an existing file; the
    files themselves are checked where the command checks its outputs (simfog.files.refuse_existing)."""
    folder = output_name(output, "-o", folder=True)
    if output_kind(folder, "-o") == "file":
        raise ConfigError("-o", output, f"a folder for {command}'s files (this is a file); -o names a folder where a "
                          "command writes several files")
    return str(folder / command)
