"""Titles of figures and result headers: what a number is of, in one line. A reader of a figure alone must see the
model and the trace file it was measured in, the device its compute times come from, the network (the network file
or measurement the links came from, else the links as written) and the collective, so they are built here once for
every command."""

from __future__ import annotations

from pathlib import Path

from simfog import units
from simfog.experiment import Experiment


def device(exp: Experiment) -> str:
    """The device the trace's compute times are of: its name (or kind), "estimated" when retargeted."""
    d = exp.workload.trace.device or {}
    name = str(d.get("name") or d.get("kind") or "unknown device")
    return f"{name} (estimated)" if d.get("estimated") else name


def network(exp: Experiment) -> str:
    """Where the links come from: the network file, the network trace, else the NIC as the experiment writes it."""
    if exp.network is not None:
        return f"network {Path(exp.network.path).name or 'file'}"
    if exp.network_trace:
        return f"network trace {Path(exp.network_trace).name}"
    return f"NIC {units.format_bandwidth(exp.cluster.nic.bandwidth_Bps)}"


def run_title(exp: Experiment, *, collective: str | None = None, ranks: bool = True, extra: str = "") -> str:
    """'resnet50 (batch 32/rank) on v100 (estimated), 64 ranks (8 x 8), NIC 25 Gbit/s, ring; mean layer times',
    with `collective` in place of the experiment's (e.g. a list) and `extra` (e.g. the algorithm) before it;
    `ranks` False leaves out the rank count (a curve over ranks). [ESTIMATED inputs] ends it where they are."""
    t, c = exp.workload.trace, exp.cluster
    where = f"{exp.ranks} ranks ({c.nodes} x {c.ranks_per_node})" if ranks else f"{c.ranks_per_node} per node"
    what = ", ".join(x for x in (extra, collective or exp.comm.collective) if x)
    title = (f"{t.model} (batch {t.batch_size}/rank) on {device(exp)}, {where}, {network(exp)}, {what}; "
             f"{exp.workload.compute} layer times of {trace(exp)}")
    return title + (" [ESTIMATED inputs]" if exp.estimated else "")


def trace(exp: Experiment) -> str:
    """The trace file the layer times come from: 'trace resnet50-v100.json.gz'."""
    return f"trace {Path(exp.workload.trace_path).name}"


def plan_title(exp: Experiment, catalogue, what: str) -> str:
    """'resnet50 (batch 32/GPU) on v100 at GPUs 16, 64; mean layer times of trace r50.json; catalogue
    prices.toml (network files a100-ib.toml)': a plan's networks are its options', named by the catalogue (and the
    network files its options use); `what` says what was asked (a target, fixed counts)."""
    t = exp.workload.trace
    files = sorted({Path(o.network.path).name for o in catalogue.options if o.network is not None})
    where = f"catalogue {Path(catalogue.source).name}" if catalogue.source else "catalogue"
    where += f" (network files {', '.join(files)})" if files else ""
    title = (f"{t.model} (batch {t.batch_size}/GPU) on {device(exp)} {what}; {exp.workload.compute} layer times of "
             f"{trace(exp)}; {where}")
    return title + (" [ESTIMATED inputs]" if exp.estimated else "")


def input_columns(exp: Experiment) -> dict[str, str]:
    """The columns a table's rows carry to name their inputs, as a sweep CSV's do: the trace's path, the network file
    and the network trace the links came from ("none" where the experiment writes its links itself)."""
    return {"trace": exp.workload.trace_path or "", "network_file": exp.network.path if exp.network else "none",
            "network_trace": exp.network_trace or "none"}
