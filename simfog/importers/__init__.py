"""Importers: third-party measurement files -> ModelTrace / NetworkTrace.

    from simfog.importers import import_file
    trace = import_file("nccl-tests", "nccl_8.log")

Every importer is a function `(path, **options) -> ModelTrace | NetworkTrace` in IMPORTERS (`simfog list`).
Each states in provenance.notes what it read, what it inferred and what is unknown; source is "imported".
"""

from __future__ import annotations

import inspect
from pathlib import Path

from simfog.errors import ConfigError
from simfog.importers.kineto import import_kineto
from simfog.importers.mgwfbp import import_mgwfbp
from simfog.importers.nccl_tests import import_nccl_tests
from simfog.importers.osu import import_osu
from simfog.registry import Registry
from simfog.trace import ModelTrace, NetworkTrace, model_trace_from_dict, network_trace_from_dict

IMPORTERS: Registry = Registry("importer")
IMPORTERS.register("kineto")(import_kineto)
IMPORTERS.register("nccl-tests")(import_nccl_tests)
IMPORTERS.register("osu")(import_osu)
IMPORTERS.register("mgwfbp")(import_mgwfbp)


def options_of(kind: str) -> dict[str, inspect.Parameter]:
    """The keyword options importer `kind` accepts (name -> inspect.Parameter)."""
    fn = IMPORTERS.get(kind, field="kind")
    return {n: p for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}


def import_file(kind: str, path: str | Path, **options) -> ModelTrace | NetworkTrace:
    """Import `path` with importer `kind` ("kineto", "nccl-tests", "osu", "mgwfbp"; see IMPORTERS).

    Returns the trace, already checked against the trace format (so it saves and loads back unchanged).
    Raises ConfigError for an unknown kind or option, a missing, truncated or wrong file (naming it).
    """
    fn = IMPORTERS.get(kind, field="kind")
    allowed = options_of(kind)
    for name in options:
        if name not in allowed:
            raise ConfigError("option", name, f"an option of importer {kind}: {', '.join(allowed) or 'none'}",
                              source=str(path))
    if not Path(path).is_file():
        raise ConfigError("path", str(path), "an existing file")
    trace = fn(path, **options)
    check = model_trace_from_dict if isinstance(trace, ModelTrace) else network_trace_from_dict
    try:
        check(trace.to_dict())
    except ConfigError as e:  # an importer bug or a file whose content the format cannot hold
        raise e.in_file(str(path)) from None
    return trace


__all__ = ["IMPORTERS", "import_file", "options_of"]
