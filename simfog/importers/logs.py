"""What the text-log importers (nccl-tests, OSU, IMB) share: cleaning lines, warnings, numbers in file names."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from simfog.errors import ConfigError
from simfog.trace import COLLECTIVES

# Open MPI `--tag-output` prefix, e.g. `[1,0]<stdout>:`; it can also be interleaved inside a line.
_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class ImporterWarning(UserWarning):
    """A file imported with a caveat the user should see (truncated log, guessed process count, uneven layout).
    `simfog import` prints each one as `simfog: warning: ...`; library callers get them through `warnings`."""


def warn(path: str, message: str) -> None:
    """Issue an ImporterWarning naming the file."""
    warnings.warn(f"{path}: {message}", ImporterWarning, stacklevel=3)


def clean_lines(text: str) -> list[str]:
    """Lines without CR, trailing blanks and Open MPI output tags (anywhere in the line)."""
    return [_TAG.sub("", line).rstrip("\r").rstrip() for line in text.split("\n")]


def is_number(token: str) -> bool:
    return _NUMBER.fullmatch(token) is not None


def number_in_name(path: str | Path) -> int | None:
    """The process count a file name states, `allreduce4.log` -> 4, `osu_allreduce_np16.txt` -> 16: the one group
    of digits, at the end of the name without its suffixes. None when there is none or several."""
    stem = Path(path).name.split(".")[0]
    m = re.fullmatch(r"\D*?(\d+)", stem)
    return int(m.group(1)) if m and int(m.group(1)) >= 1 else None


def ranks_option(value: object, runs: int, path: str) -> list[int | None]:
    """The `ranks` option of a log importer -> one process count (or None: not given) per run in the file.
    Accepts None, an integer, or a comma-separated list with one integer per run ("2,4,8")."""
    allowed = f"an integer >= 1, or one per run in the file ({runs} run{'s' if runs != 1 else ''}), e.g. 2,4,8"
    if value is None:
        return [None] * runs
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError("ranks", value, allowed, source=path)
        return [value] * runs
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if all(p.isdigit() and int(p) >= 1 for p in parts):
            if len(parts) == 1:
                return [int(parts[0])] * runs
            if len(parts) == runs:
                return [int(p) for p in parts]
    raise ConfigError("ranks", value, allowed, source=path)


# Collective names as tools print them (lower case, without '_' and '-') -> simfog's.
COLLECTIVE_NAMES = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reduce_scatter",
                    "broadcast": "broadcast", "bcast": "broadcast", "reduce": "reduce", "alltoall": "alltoall",
                    "sendrecv": "sendrecv"}


def collective_option(value: object, path: str) -> str | None:
    """The `collective` option of a log importer -> simfog's name (None if not given); ConfigError otherwise."""
    if value is None:
        return None
    key = value.lower().replace("_", "").replace("-", "") if isinstance(value, str) else None
    if key not in COLLECTIVE_NAMES:
        raise ConfigError("collective", value, f"one of {', '.join(COLLECTIVES)}", source=path)
    return COLLECTIVE_NAMES[key]


def launcher_ranks(lines: list[str]) -> int | None:
    """The process count of the last launcher command (`mpirun -np 4 ...`, `srun -n 8 ...`) or `# np = 4` comment
    among `lines`, else None."""
    found = None
    for line in lines:
        m = _LAUNCH.search(line) or _NP_COMMENT.match(line)
        if m:
            found = int(m.group(1))
    return found


_LAUNCH = re.compile(r"\b(?:mpirun|mpiexec(?:\.hydra)?|orterun|srun|aprun)\b.*?\s(?:-np|-n|--np|--ntasks|-c)"
                     r"(?:\s+|=)(\d+)\b")
_NP_COMMENT = re.compile(r"#\s*(?:np|nprocs|processes|ranks)\s*[:=]\s*(\d+)\s*$", re.IGNORECASE)
