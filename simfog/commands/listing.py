"""`simfog list`: every registered collective, merge policy, training algorithm, topology, importer, exporter and GPU
(`simfog list devices`: the specifications `simfog retarget` reads, simfog/data/gpus.toml), and the shipped clusters
(`simfog list clusters`: one line each, its name first; simfog.nccl.clusters)."""

from __future__ import annotations

import importlib

REGISTRIES = [
    ("collectives", "simfog.collectives", "ALGORITHMS"),
    ("merge policies", "simfog.merge", "POLICIES"),
    ("algorithms", "simfog.algorithms", "REGISTRY"),
    ("topologies", "simfog.topology", "TOPOLOGIES"),
    ("importers", "simfog.importers", "IMPORTERS"),
    ("exporters", "simfog.exporters", "EXPORTERS"),
    ("devices", "simfog.gpu.specs", "DEVICES"),
]


def add_arguments(parser) -> None:
    parser.add_argument("kind", nargs="?", help="only this kind (e.g. collectives)")


def entries() -> dict[str, list[tuple[str, str]]]:
    """{kind: [(name, one-line description)]} for every registry that is installed."""
    out = {}
    for kind, module, attr in REGISTRIES:
        try:
            out[kind] = getattr(importlib.import_module(module), attr).describe()
        except ModuleNotFoundError:
            continue
    from simfog.nccl import clusters

    out["clusters"] = clusters.entries()
    return out


def run(args) -> int:
    from simfog.errors import ConfigError

    found = entries()
    if args.kind and not any(k.startswith(args.kind) for k in found):
        raise ConfigError("kind", args.kind, f"one of {', '.join(found)}")
    for kind, items in found.items():
        if args.kind and not kind.startswith(args.kind):
            continue
        print(f"{kind}:")
        width = max(len(n) for n, _ in items) if items else 0
        for name, doc in items:
            print(f"  {name:<{width}}  {doc}")
    return 0
