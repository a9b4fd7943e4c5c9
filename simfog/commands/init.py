"""`simfog init [--trace T] [--gpu H100] [--network net.toml] [--nodes N ...] -o exp.toml [--catalogue cat.toml]`:
a starter experiment file, every key annotated, that runs as written (`simfog simulate exp.toml`); `--catalogue`
also writes a one-option catalogue of the same cluster for `simfog plan`, so that `plan --catalogue cat.toml --gpus
N` and `simulate --ranks N` give the same throughput. Both are read back by simfog's own readers before they are
written: a bad value fails, naming its option, and nothing is written."""

from __future__ import annotations

import os
from pathlib import Path

from simfog.commands.simulate import add_cluster_overrides


def add_arguments(parser) -> None:
    parser.add_argument("-o", "--output", metavar="FILE", default="experiment.toml",
                        help="the experiment file to write")
    parser.add_argument("--trace", metavar="FILE", help="your model trace (simfog collect model, simfog import, "
                        "simfog retarget) (default: the embedded ResNet-50 example, A100 ESTIMATED)")
    parser.add_argument("--gpu", help='the GPU model of your cluster, e.g. "H100": [cluster] gpu (a trace of '
                        "another model is warned of)")
    parser.add_argument("--nodes", type=int, help="[cluster] nodes (default 4)")
    add_cluster_overrides(parser)
    parser.add_argument("--catalogue", metavar="FILE", help="also write a one-option catalogue of this cluster "
                        "for simfog plan (every key annotated; its price is a placeholder)")
    parser.add_argument("--force", action="store_true", help="overwrite existing files")


def _toml(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def _path_from(folder: Path, value: str, *, name_allowed: bool = False) -> str:
    """`value`, a path given relative to here, as the file in `folder` must write it (relative where it can be); a
    bare name that is no file here passes as given when `name_allowed` (a network by name)."""
    path = Path(value)
    if name_allowed and not path.exists() and os.sep not in value and not value.endswith(".toml"):
        return value
    try:
        return os.path.relpath(path.absolute(), folder.absolute())
    except ValueError:  # another drive
        return str(path.absolute())


def _line(assignment: str, comment: str) -> str:
    """`key = value`, its comment from column 32 (or two spaces after a long one)."""
    return f"{assignment:<30} # {comment}" if len(assignment) < 30 else f"{assignment}  # {comment}"


def cluster_lines(c: dict, *, catalogue: bool = False) -> list[str]:
    """The cluster's keys, annotated: an experiment's [cluster] or a catalogue's [[option]] (`catalogue`)."""
    net = c.get("network")
    links = "# " if net else ""  # a network file sets the links: the keys stay, commented, to show what they are
    gpu = "the GPU model: a trace of another model is warned of"
    return [
        _line(f"max_nodes = {c['max_nodes']}", "the most nodes the plan may use") if catalogue else
        _line(f"nodes = {c['nodes']}", "nodes in the run (--nodes and --ranks override it)"),
        _line(f"gpus_per_node = {c['gpus_per_node']}", "GPUs in one node"),
        _line(f"gpu = {_toml(c['gpu'])}", gpu) if "gpu" in c else _line('# gpu = "H100"', gpu),
        _line(f"network = {_toml(net)}", "a calibrated network file (simfog calibrate LOGS -o FILE), relative to "
              "this file: its bus bandwidths and latency are the links, and the collective defaults to \"nccl\" "
              "(NCCL's model on it)") if net else
        _line('# network = "network.toml"', "instead of the links below: a calibrated network file (simfog "
              "calibrate LOGS -o FILE); the collective then defaults to \"nccl\""),
        _line(f"{links}intra_bandwidth = {_toml(c['intra_bandwidth'])}", "GPU to GPU inside a node, per direction"
              + ("; required without network" if catalogue else " (default 150GB/s)")),
        _line(f"intra_latency = {_toml(c['intra_latency'])}", "default 0us"),
        _line(f"{links}nic_bandwidth = {_toml(c['nic_bandwidth'])}", "one node's network, per direction; required "
              "without network"),
        _line(f"{links}nic_latency = {_toml(c['nic_latency'])}", "default 0us"),
        _line(f"gpu_memory = {_toml(c['gpu_memory'])}", "device memory: configurations needing more are refused"),
        _line("# oversubscription = 1.0", ">= 1: each NIC this many times slower when every node sends")]


def experiment_text(trace: str, c: dict, comm: dict, compute_note: str) -> str:
    from simfog.experiment import COMPUTE_MODES, DEFAULT_COMPUTE, DEFAULT_ITERATIONS, DEFAULT_SEED

    compute = (_line('compute = "mean"', compute_note) if compute_note else
               _line(f'# compute = "{DEFAULT_COMPUTE}"', f'layer times: {" | ".join(COMPUTE_MODES)} (default '
                     f"{DEFAULT_COMPUTE}); every command (simulate, sweep, curve, plan) runs the mode written here"))
    return "\n".join([
        "# simfog experiment, written by `simfog init`: it runs as written (simfog simulate THIS_FILE); change what is",
        "# yours. Every quantity carries its unit; paths are relative to this file; unknown keys are errors. The",
        "# command line overrides nodes, gpus_per_node, nic_bandwidth and network (--nodes, --gpus-per-node, ...).",
        _line(f"seed = {DEFAULT_SEED}", "the random draws: same file and seed, same numbers"),
        _line(f"iterations = {DEFAULT_ITERATIONS}", "simulated training iterations"),
        "",
        "[workload]",
        _line(f"trace = {_toml(trace)}", "per-layer compute times and gradient sizes of one GPU: simfog collect "
              "model (measure), simfog import (a profiler trace), simfog retarget (estimate one for another GPU)"),
        compute,
        "",
        "[cluster]",
        *cluster_lines(c),
        "",
        "[comm]",
        _line('algorithm = "allreduce"', "data-parallel training as DDP runs it (simfog list: every algorithm)"),
        _line(f"collective = {_toml(comm['collective'])}", "how a bucket is allreduced (simfog list: collectives)"),
        _line('merge = "ddp"', "how gradients are put into buckets (simfog list: merge policies)"),
        _line('# threshold = "25MiB"', "bucket size: DDP's bucket_cap_mb (simfog tune searches it)"),
        ""])


def catalogue_text(c: dict, price: float = 2.0, currency: str = "USD") -> str:
    """A one-option catalogue of the cluster `c` (its keys as the experiment's), every key annotated: what
    `simfog init --catalogue` writes and `simfog plan --help` shows."""
    return "\n".join([
        "# simfog catalogue, for simfog plan --catalogue THIS_FILE: ways to buy a cluster, with their prices.",
        "# One [[option]] table per way; copy the table for more (names unique). Quantities carry their units.",
        _line(f"currency = {_toml(currency)}", "the currency of every price"),
        _line('note = "placeholder price: put your provider\'s"', "shown with the plan (optional)"),
        "",
        "[[option]]",
        _line(f"name = {_toml(c.get('name', 'mine'))}", "the plan's rows name it"),
        _line('# description = "8 GPUs per node, 100 Gbit/s Ethernet"', "free text (optional)"),
        _line(f"price_per_gpu_hour = {price!r}", "one GPU for one hour, in currency"),
        *cluster_lines(c, catalogue=True),
        _line('# collectives = ["ring", "hierarchical"]', "tried each (default: the workload's collective; "
              '"nccl" with a network file)'),
        _line('# merges = ["ddp", "mgwfbp"]', "tried each (default: the workload's merge policy)"),
        '# fabric = { kind = "fat_tree", nodes_per_leaf = 8, leaf_oversubscription = 4, placement = "scattered" }',
        "#   the switches of max_nodes nodes and where a job's nodes sit (an experiment's [fabric] keys); each row "
        "then says what they cost",
        ""])


# The cluster `init` starts from where no option says otherwise: links a user states (4 nodes x 8 GPUs over 25 Gbit/s
# Ethernet), not the embedded example's shipped cluster, so that every key of a cluster shows in the file.
TEMPLATE = {"nodes": 4, "gpus_per_node": 8, "intra_bandwidth": "150GB/s", "intra_latency": "2us",
            "nic_bandwidth": "25Gbit/s", "nic_latency": "10us", "gpu_memory": "80GB"}


def _cluster(args, folder: Path) -> dict:
    """TEMPLATE with the options given in place; a shipped cluster named by --network brings its GPUs per node."""
    from simfog.network_file import load_named

    c = dict(TEMPLATE)
    for key in ("nodes", "gpus_per_node", "nic_bandwidth", "gpu"):
        if getattr(args, key) is not None:
            c[key] = getattr(args, key)
    if args.network is not None:
        c["network"] = _path_from(folder, args.network, name_allowed=True)
        named = load_named(args.network, ".", field="--network").cluster
        if named is not None and args.gpus_per_node is None:
            c["gpus_per_node"] = named.gpus_per_node
    c["max_nodes"] = max(64, c["nodes"])
    return c


def run(args) -> int:
    import tomllib
    import warnings

    from simfog import experiment, plan
    from simfog.data import DEFAULT_EXPERIMENT
    from simfog.files import atomic_open, check_output, refuse_existing
    from simfog.overrides import as_options, cluster_keys
    from simfog.trace import load_model_trace

    out = check_output(args.output)
    cat = check_output(args.catalogue) if args.catalogue else None
    refuse_existing([out, cat], force=args.force)
    c = _cluster(args, out.parent)
    if args.trace is not None:
        trace = _path_from(out.parent, args.trace)
    else:
        trace = str(DEFAULT_EXPERIMENT.with_name("resnet50-a100-b32-estimated.json.gz"))
    samples = load_model_trace(out.parent / trace).samples if (out.parent / trace).exists() else 0
    note = ("the trace holds one sample per layer: drawing from it adds nothing, and means take the fast symmetric "
            "path" if samples == 1 else "")
    text = experiment_text(trace, c, {"collective": "nccl" if "network" in c else "ring"}, note)
    given = cluster_keys(nodes=args.nodes, gpus_per_node=args.gpus_per_node, nic_bandwidth=args.nic_bandwidth)
    given |= {k: c[k] for k in ("network", "gpu") if k in c and getattr(args, k) is not None}  # as the file has them
    with as_options(given, str(out)):
        experiment.from_dict(tomllib.loads(text), base_dir=out.parent, source=str(out))  # it runs as written
    cat_text = catalogue_text(c) if cat is not None else None
    if cat is not None:
        with as_options(given, str(cat), prefix=r"option\[0\] \(mine\)\."), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its cluster's, which the experiment's reading has just said
            plan.catalogue_from_dict(tomllib.loads(cat_text), str(cat))
    with atomic_open(out) as f:
        f.write(text)
    print(f"wrote {out}: simfog simulate {out}")
    if cat is not None:
        with atomic_open(cat) as f:
            f.write(cat_text)
        print(f"wrote {cat}: simfog plan {out} --catalogue {cat} --gpus 8,64,256 (its price is a placeholder)")
    return 0
