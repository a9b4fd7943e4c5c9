"""Importers: third-party measurement files -> ModelTrace / NetworkTrace.

    from simfog.importers import import_file, import_files
    trace = import_file("nccl-tests", "nccl_8.log")
    net = import_files("nccl-tests", ["nccl_8.log", "nccl_16.log"])     # one NetworkTrace from several logs

Every importer is a function `(path, **options) -> ModelTrace | NetworkTrace` in IMPORTERS (`simfog list`).
Each states in provenance.notes what it read, what it inferred and what is unknown; source is "imported".
The log importers (nccl-tests, osu, imb) keep per-run details in extra[<tool>], a list with one dict per run
(a test or section of a file) whose "measurements" is the [start, stop) index range of its measurements; merging
several files concatenates those lists and shifts the ranges. Caveats (a truncated log, a guessed process count)
are ImporterWarning warnings.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from simfog import files
from simfog.errors import ConfigError
from simfog.importers.chakra import import_chakra, import_chakra_files
from simfog.importers.imb import import_imb
from simfog.importers.kineto import import_kineto, import_kineto_comm
from simfog.importers.kineto_ranks import import_folder, import_folder_comm
from simfog.importers.logs import ImporterWarning
from simfog.importers.mgwfbp import import_mgwfbp
from simfog.importers.nccl_tests import import_nccl_tests
from simfog.importers.osu import import_osu
from simfog.registry import Registry
from simfog.trace import ModelTrace, NetworkTrace, Provenance, model_trace_from_dict, network_trace_from_dict

IMPORTERS: Registry = Registry("importer")
IMPORTERS.register("kineto")(import_kineto)
IMPORTERS.register("kineto-comm")(import_kineto_comm)
IMPORTERS.register("nccl-tests")(import_nccl_tests)
IMPORTERS.register("osu")(import_osu)
IMPORTERS.register("mgwfbp")(import_mgwfbp)
IMPORTERS.register("imb")(import_imb)
IMPORTERS.register("chakra")(import_chakra)
# Importers that also read a folder (one trace per rank, as HTA reads it): kind -> the folder's importer, with the
# same options.
FOLDER_IMPORTERS = {"kineto": import_folder, "kineto-comm": import_folder_comm}
# Model importers that read several files as the ranks of one run: kind -> the importer of a list of files, with the
# same options.
RANK_FILE_IMPORTERS = {"chakra": import_chakra_files}


def options_of(kind: str) -> dict[str, inspect.Parameter]:
    """The keyword options importer `kind` accepts (name -> inspect.Parameter)."""
    fn = IMPORTERS.get(kind, field="kind")
    return {n: p for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}


def import_file(kind: str, path: str | Path, **options) -> ModelTrace | NetworkTrace:
    """Import `path` with importer `kind` ("kineto", "nccl-tests", "osu", "imb", "mgwfbp"; see IMPORTERS).

    `path` may be a folder for the importers that read one (kineto, kineto-comm: one trace per rank).
    Returns the trace, already checked against the trace format (so it saves and loads back unchanged).
    Raises ConfigError for an unknown kind or option, a missing, truncated or wrong file (naming it).
    """
    fn = IMPORTERS.get(kind, field="kind")
    allowed = options_of(kind)
    for name in options:
        if name not in allowed:
            raise ConfigError("option", name, f"an option of importer {kind}: {', '.join(allowed) or 'none'}",
                              source=str(path))
    if kind in FOLDER_IMPORTERS and Path(path).is_dir():  # kineto: a folder of rank traces
        fn = FOLDER_IMPORTERS[kind]
    else:
        files.check_input(path)  # a missing file, a directory, a FIFO or /dev/zero: refused before any importer reads
    trace = fn(path, **options)
    check = model_trace_from_dict if isinstance(trace, ModelTrace) else network_trace_from_dict
    try:
        check(trace.to_dict())
    except ConfigError as e:  # an importer bug or a file whose content the format cannot hold
        raise e.in_file(str(path)) from None
    return trace


def makes_network_trace(kind: str) -> bool:
    """Whether importer `kind` makes a NetworkTrace (and so can merge several files)."""
    fn = IMPORTERS.get(kind, field="kind")
    return "NetworkTrace" in str(inspect.signature(fn).return_annotation)


def import_files(kind: str, paths, **options) -> ModelTrace | NetworkTrace:
    """Import one or several files with importer `kind` (same options for each); several files, for the importers
    that make a NetworkTrace, are merged into one (merge_network_traces).

    Several files for a model importer that reads rank files (RANK_FILE_IMPORTERS: chakra) are the ranks of one
    run, read into one ModelTrace. Raises ConfigError for no file, a file given twice, several files for another
    model importer, and what import_file raises."""
    paths = [paths] if isinstance(paths, str | Path) else list(paths)
    if not paths:
        raise ConfigError("file", [], "one or more files")
    IMPORTERS.get(kind, field="kind")
    if len(paths) == 1:
        return import_file(kind, paths[0], **options)
    if kind in RANK_FILE_IMPORTERS:
        return _import_rank_files(kind, paths, **options)
    if not makes_network_trace(kind):
        raise ConfigError("file", [str(p) for p in paths], f"one file: importer {kind} makes a model trace from a "
                          "single file (several files merge only for network importers: "
                          f"{', '.join(k for k in IMPORTERS.names() if makes_network_trace(k))})")
    seen: dict[Path, str] = {}
    for p in paths:
        key = Path(p).resolve()
        if key in seen:
            raise ConfigError("file", str(p), f"each file once (same file as {seen[key]})")
        seen[key] = str(p)
    return merge_network_traces([import_file(kind, p, **options) for p in paths], [str(p) for p in paths], kind)


def _import_rank_files(kind: str, paths: list, **options) -> ModelTrace:
    """Several files, one per rank, read by importer `kind`'s RANK_FILE_IMPORTERS entry into one ModelTrace."""
    allowed = options_of(kind)
    for name in options:
        if name not in allowed:
            raise ConfigError("option", name, f"an option of importer {kind}: {', '.join(allowed) or 'none'}",
                              source=str(paths[0]))
    seen: dict[Path, str] = {}
    for p in paths:
        files.check_input(p)
        key = Path(p).resolve()
        if key in seen:
            raise ConfigError("file", str(p), f"each file once (same file as {seen[key]})")
        seen[key] = str(p)
    trace = RANK_FILE_IMPORTERS[kind](paths, **options)
    try:
        model_trace_from_dict(trace.to_dict())
    except ConfigError as e:
        raise e.in_file(str(paths[0])) from None
    return trace


def merge_network_traces(traces: list[NetworkTrace], names: list[str], kind: str) -> NetworkTrace:
    """One NetworkTrace holding the measurements of `traces` (imported from the files `names`), in file order.

    backend must agree (ConfigError naming the first file that differs); transport is the common one or "mixed"
    (each run's is in extra); date the earliest known; notes list every file with its own notes. extra: the
    per-run lists of each key are concatenated, their "measurements" index ranges shifted to the merged list, and
    each run gets "path", the file as given."""
    backends = [t.backend for t in traces]
    for name, backend in zip(names, backends, strict=True):
        if backend != backends[0]:
            raise ConfigError("backend", backend, f"{backends[0]}, the backend of {names[0]} (one backend per "
                              "network trace)", source=name)
    transports = {t.transport for t in traces}
    measurements: list = []
    extra: dict[str, list] = {}
    for name, trace in zip(names, traces, strict=True):
        offset = len(measurements)
        measurements += trace.measurements
        for key, value in trace.extra.items():
            for run in value if isinstance(value, list) else [value]:
                if isinstance(run, dict):
                    run = dict(run, path=name)
                    if isinstance(run.get("measurements"), list) and len(run["measurements"]) == 2:
                        run["measurements"] = [i + offset for i in run["measurements"]]
                extra.setdefault(key, []).append(run)
    dates = sorted(t.provenance.date for t in traces if t.provenance.date != "unknown")
    hosts = list(dict.fromkeys(t.provenance.host for t in traces if t.provenance.host != "unknown"))
    notes = (f"Merged by `simfog import {kind}` from {len(traces)} files, measurements in this order: "
             + " | ".join(f"[{i + 1}] {name}: {t.provenance.notes}" for i, (name, t) in
                          enumerate(zip(names, traces, strict=True))))
    return NetworkTrace(
        backend=backends[0], transport=transports.pop() if len(transports) == 1 else "mixed",
        provenance=Provenance(command=f"simfog import {kind} {' '.join(names)}", date=dates[0] if dates else "unknown",
                              host=hosts[0] if len(hosts) == 1 else (", ".join(hosts) if hosts else "unknown"),
                              source="imported", estimated=any(t.provenance.estimated for t in traces), notes=notes),
        measurements=tuple(measurements), extra=extra)


__all__ = ["IMPORTERS", "ImporterWarning", "import_file", "import_files", "makes_network_trace",
           "merge_network_traces", "options_of"]
