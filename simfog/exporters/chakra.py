"""An experiment's workload as Chakra execution traces ASTRA-sim runs: one file per rank, workload.<rank>.et, plus
ASTRA-sim's network, system and memory inputs (simfog.exporters.astra_sim) and export.json, what was written and
how to run it.

One training iteration per rank, in data dependencies (what ASTRA-sim's feeder orders by), on the rules of
simfog's engine (simfog.exporters.chakra_nodes). The bucketed allreduce:

    forward of layer 0 -> ... -> forward of layer L-1 -> backward of layer L-1 -> ... -> backward of layer 0
    bucket k's ALL_REDUCE <- the backward node after which its last gradient is ready, and bucket k-1
    optimizer <- the last backward node and the last bucket

with the buckets simfog's static merge policy makes (simfog.algorithms.allreduce.plan.static_plan), in launch
order on one communication stream. The sharded algorithms (fsdp, zero1, zero2, zero3): the plan's steps
(simfog.algorithms.sharded.plan), each collective issued where compute reaches its step or hook, compute waiting
for what it needs. Compute nodes last each layer's mean time on that rank (its recorded rank's mean where the
trace has several, times its [heterogeneity] slowdown; the optimizer step divided among the shards as the engine
does), in whole microseconds: the unit of Chakra's duration_micros, which ASTRA-sim replays. Node ids follow
issue order (ASTRA-sim issues the lowest ready id first). Ranks with the same times share one file's bytes (hard
links where the file system has them).

Beside Chakra's fields every node carries simfog's exact values (simfog.importers.chakra: every sample in
seconds, the layers' parameter tensors, each bucket's tensors, the trace's other fields in the GlobalMetadata),
which ASTRA-sim ignores and `simfog import chakra` reads back, so that export then import gives the same
simulation bit for bit.

What the traces cannot say, written in export.json's notes: per-iteration compute draws and stragglers (ASTRA-sim
replays one duration per node), the launch overhead, bucket copies and backward slowdown of [comm] (no node type
holds work on the communication stream), several streams (ASTRA-sim's NPU runs one collective at a time).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from simfog import merge
from simfog.engine.compute import ComputeModel
from simfog.errors import ConfigError
from simfog.exporters import astra_sim
from simfog.exporters.chakra_nodes import allreduce_nodes, sharded_nodes
from simfog.importers import chakra as names
from simfog.importers import chakra_schema as schema

ASTRA_BINARY = "AstraSim_Analytical_Congestion_Unaware"


@dataclass(frozen=True)
class Export:
    """What `export_chakra` wrote: `folder`, `ranks` workload files of which `distinct` differ, `nodes` per file,
    `collectives` per iteration, `notes` (what ASTRA-sim will not see) and ASTRA-sim's command line."""

    folder: Path
    ranks: int
    distinct: int
    nodes: int
    collectives: int
    notes: tuple[str, ...]
    command: str


SHARDED = ("fsdp", "zero1", "zero2", "zero3")  # sharded algorithms whose collectives all span every rank


def check_exportable(exp) -> None:
    """ConfigError naming the [comm] key when `exp` holds what the Chakra export cannot write."""
    c = exp.comm
    if c.algorithm not in ("allreduce", *SHARDED):
        raise ConfigError("comm.algorithm", c.algorithm, f"one of allreduce, {', '.join(SHARDED)} (the algorithms "
                          "whose collectives all span every rank, fixed before the run)", source=exp.source)
    if c.algorithm == "allreduce" and c.merge in merge.DYNAMIC:
        raise ConfigError("comm.merge", c.merge, "a static merge policy (buckets fixed before the run): "
                          f"{', '.join(n for n in merge.POLICIES.names() if n not in merge.DYNAMIC)}",
                          source=exp.source)
    if c.streams != 1:
        raise ConfigError("comm.streams", c.streams, "1: ASTRA-sim runs one collective at a time per NPU",
                          source=exp.source)


def export_chakra(exp, folder: str | os.PathLike, *, force: bool = False, exact: bool = True) -> Export:
    """Chakra execution traces of every rank, and ASTRA-sim's network, system and memory inputs.

    Writes `exp`'s workload into the new folder `folder` (see the module docstring): it appears complete or not at
    all. `exact` False leaves simfog's attributes out: Chakra's fields only, smaller
    files (ASTRA-sim keeps every node's attributes in memory: a tenth of the bytes at 8,192 ranks), which
    `simfog import chakra` reads per operator. Raises ConfigError for an experiment the export cannot write
    (check_exportable, astra_sim.config) or a folder that exists (unless `force`, which replaces it)."""
    from simfog.simulation import new_simulation

    folder = Path(folder)
    if os.path.lexists(folder) and not force:
        raise ConfigError("-o", str(folder), "a folder that does not exist yet (add --force to replace it)")
    check_exportable(exp)
    astra = astra_sim.config(exp.cluster, exp.comm.collective, source=exp.source)
    sim = new_simulation(exp)  # checks the run as `simfog simulate` does (memory, groups); its rank slowdowns
    graph, collectives = _graph(exp, sim)
    means = ComputeModel.from_trace(exp.workload.trace, "mean")
    shards = getattr(sim.algorithm, "shards", 1)
    metadata = _metadata(exp) if exact else schema.GlobalMetadata(version=schema.WRITTEN_VERSION)
    ranks_of: dict[tuple, list[int]] = {}  # (recorded rank's row, slowdown) -> the ranks with those times
    for rank in range(exp.ranks):
        ranks_of.setdefault((rank % len(means.forward_s), float(sim.slowdown[rank])), []).append(rank)
    contents: dict[bytes, list[int]] = {}
    for (row, factor), ranks in ranks_of.items():
        host = means.host_s[row]  # the optimizer step's host time is not sharded (the engine's rule)
        optimizer = ((means.optimizer_s[row] - host) / shards + host) * factor
        nodes = graph(means.layer_forward_s[row] * factor, means.layer_backward_s[row] * factor, optimizer)
        if not exact:
            nodes = [_chakra_only(n) for n in nodes]
        contents.setdefault(schema.encode(metadata, nodes), []).extend(ranks)
    notes = (*_notes(exp), *astra.notes)
    command = (f"{ASTRA_BINARY} --workload-configuration={folder}/workload --system-configuration={folder}/"
               f"system.json --network-configuration={folder}/network.yml --remote-memory-configuration={folder}/"
               "memory.json")
    manifest = {"format": "simfog.chakra-export/1", "experiment": exp.source, "ranks": exp.ranks,
                "algorithm": exp.comm.algorithm, "merge": exp.comm.merge, "collective": exp.comm.collective,
                "collectives": collectives, "chakra_schema": schema.WRITTEN_VERSION, "astra_sim": command,
                "notes": list(notes)}
    _write(folder, contents, astra, manifest, force)
    return Export(folder, exp.ranks, len(contents), len(nodes), len(collectives), notes, command)


def _graph(exp, sim):
    """(times -> one rank's nodes, the collectives of an iteration as [{op, bytes, name}]) for `exp`'s algorithm."""
    trace = exp.workload.trace
    if exp.comm.algorithm == "allreduce":
        from simfog.algorithms.allreduce.plan import static_plan

        buckets = static_plan(exp)
        return (lambda f, b, o: allreduce_nodes(trace, buckets, f, b, o),
                [{"op": "allreduce", "bytes": b.nbytes, "name": f"bucket{k}", "tensors": len(b.tensors)}
                 for k, b in enumerate(buckets)])
    alg = sim.algorithm
    plan = alg.plan
    for coll in plan.colls:
        if coll.group == "replica" or (coll.group == "shard" and alg.group_size != exp.ranks):
            raise ConfigError("comm.algorithm", exp.comm.algorithm, f"collectives over every rank (its {coll.name} "
                              f"runs among {coll.group} groups)", source=exp.source)
    return (lambda f, b, o: sharded_nodes(trace, plan, exp.ranks, f, b, o),
            [{"op": c.op, "bytes": c.nbytes, "name": c.name} for c in plan.colls])


def _chakra_only(node):
    """`node` without simfog's attributes."""
    keep = [a for a in node.attr if not a.name.startswith("simfog.")]
    del node.attr[:]
    node.attr.extend(keep)
    return node


def _metadata(exp):
    """The GlobalMetadata: Chakra's version and simfog's schema, and the trace's fields but its layers and step
    times (those ride on the nodes)."""
    d = exp.workload.trace.to_dict()
    for key in ("layers", "optimizer_s", "host_s"):
        d.pop(key, None)
    experiment = {"source": exp.source, "ranks": exp.ranks, "algorithm": exp.comm.algorithm, "merge": exp.comm.merge,
                  "collective": exp.comm.collective}
    return schema.GlobalMetadata(version=schema.WRITTEN_VERSION, attr=[
        schema.attr("schema", string_val=names.SIMFOG_SCHEMA),
        schema.attr(names.TRACE, string_val=json.dumps(d, sort_keys=True)),
        schema.attr("simfog.experiment", string_val=json.dumps(experiment, sort_keys=True))])


def _notes(exp) -> list[str]:
    """What simfog simulates for `exp` that the exported traces do not hold."""
    notes = []
    trace, compute = exp.workload.trace, exp.workload.compute
    if compute != "mean" and trace.samples > (len(set(trace.sample_ranks)) or 1):
        notes.append(f'compute = "{compute}": simfog draws each rank\'s layer times per iteration from '
                     f"{trace.samples} samples; the traces hold each layer's mean (ASTRA-sim replays one duration)")
    h = exp.heterogeneity
    if h.straggler_rate and h.straggler_delay_s:
        notes.append("stragglers (heterogeneity.straggler_rate) are drawn per run: not in the traces")
    oh = exp.overheads()
    if oh.any:
        notes.append("per-bucket launch overhead, bucket copies and the backward slowdown beside a collective "
                     "([comm] overheads) are not in the traces: ASTRA-sim has no work on the communication stream")
    return notes


def _write(folder: Path, contents: dict, astra, manifest: dict, force: bool) -> None:
    """Every file into a hidden folder beside `folder`, renamed into place at the end (replacing an old one when
    `force`): a failure leaves nothing."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    try:
        for data, ranks in contents.items():
            first = tmp / f"workload.{ranks[0]}.et"
            first.write_bytes(data)
            for rank in ranks[1:]:
                try:
                    os.link(first, tmp / f"workload.{rank}.et")
                except OSError:  # no hard links here: a copy
                    shutil.copyfile(first, tmp / f"workload.{rank}.et")
        (tmp / "network.yml").write_text(astra.network_yaml())
        (tmp / "system.json").write_text(json.dumps(astra.system(), indent=1) + "\n")
        (tmp / "memory.json").write_text(json.dumps(astra.memory(), indent=1) + "\n")
        (tmp / "export.json").write_text(json.dumps(manifest, indent=1) + "\n")
        if os.path.lexists(folder):
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".old", dir=folder.parent))
            os.replace(folder, old / "x")
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    except OSError as e:
        raise ConfigError("-o", str(folder), f"a folder that can be written ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
