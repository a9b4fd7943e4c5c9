"""Write simfog's shipped clusters (simfog/data/clusters/NAME.toml, simfog.nccl.clusters) from the public nccl-tests
corpus: every cluster of bench/data/nccl-tests and of the reference set (bench/nccl_corpus.py).

Each cluster is calibrated as `simfog calibrate` does (simfog.nccl.fit) on EVERY one of its logs, with the facts its
provenance states (nccl_corpus.fit_arguments: the same facts as bench/collectives.py gives), the disturbed points
set aside by the corpus's one rule. Its own held-out error is the leave-a-scale-out's (simfog.nccl.bands): each
node count of its logs predicted from a calibration on the smaller ones; the conformal half-widths of those points
go in the file's [calibrated] section as `simfog calibrate` writes them, their median |error| in [cluster].

Prints one line per cluster (what `simfog list clusters` shows) and writes the files; `--check` compares instead of
writing and exits 1 where a file would change (the fit is deterministic: the same corpus gives the same files).

Run: python bench/ship_clusters.py [--out DIR] [--only NAME] [--check] [--ref DIR]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nccl_corpus  # noqa: E402  (bench/ is not a package)

from simfog import network_file, units  # noqa: E402
from simfog.bands import HalfWidths  # noqa: E402
from simfog.nccl import bands as nccl_bands  # noqa: E402
from simfog.nccl import fit as nccl_fit  # noqa: E402
from simfog.nccl.clusters import CLUSTERS_DIR, ClusterFacts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# the corpus's transport words (facts.toml) -> simfog.nccl.clusters.TRANSPORTS
TRANSPORT = {"ib": "ib", "ofi/slingshot": "slingshot", "socket": "tcp", "ib-or-roce": "ib", "roce": "roce",
             "efa": "efa"}


def fact(facts: dict, key: str) -> tuple[object, bool] | None:
    """(value, stated) of a facts.toml key: top level (stated) or [inferred]; None when neither has it."""
    if key in facts:
        return facts[key], True
    inferred = facts.get("inferred", {}).get(key)
    if inferred is None:
        return None
    return (inferred["value"] if isinstance(inferred, dict) else inferred), False


def described(cluster: nccl_corpus.Cluster, points: list, where: str) -> ClusterFacts:
    """The [cluster] section of a corpus cluster: its facts as stated (inferred ones marked so)."""
    f = cluster.facts

    def text(key: str) -> str:
        got = fact(f, key)
        return "" if got is None or got[0] == "not stated" else f"{got[0]}" + ("" if got[1] else " (inferred)")

    nics, rate = fact(f, "nics_per_node"), fact(f, "nic_bandwidth")
    nic_text = ""
    if nics is not None:
        nic_text = f"{nics[0]}" + (f" x {rate[0]}" if rate is not None else "") + (
            "" if nics[1] and (rate is None or rate[1]) else " (inferred)")
    transport, stated = fact(f, "transport")
    fabric = text("fabric") or "not stated"
    if not stated:
        fabric += f"; transport {transport} (inferred)"
    memory = re.search(r"(\d+)\s*GB", str(f.get("gpu", "")))
    errors = [abs(p.rel_error) for p, _ in points]
    nodes = sorted({log.nodes for log in cluster.logs})
    return ClusterFacts(
        cluster.name, str(f["gpu"]), int(f["gpus_per_node"]), TRANSPORT[str(transport)], tuple(nodes),
        nics=nic_text, fabric=fabric, nccl=str(fact(f, "nccl_version")[0]) if fact(f, "nccl_version") else "",
        gpu_memory_B=units.parse(f"{memory.group(1)}GB", "bytes") if memory else None,
        held_out_error=float(np.median(errors)) if errors else math.nan, held_out_points=len(errors),
        source=f"{where} (PROVENANCE.md and facts.toml there)")


def ship(cluster: nccl_corpus.Cluster, where: str) -> tuple[str, str]:
    """(file name, text) of one shipped cluster."""
    traces, aside = nccl_corpus.every_log(cluster)
    kwargs = nccl_corpus.fit_arguments(cluster.facts)[0]
    cal = nccl_fit.fit(traces, source=cluster.name, **kwargs)
    points, steps = nccl_bands.scale_out_points(traces, **kwargs)
    intervals = HalfWidths.from_scores(nccl_bands.scores_by_regime([p for p, _ in points]),
                                       "leave-a-scale-out on the cluster's logs: " + "; ".join(steps)) \
        if points else None
    inside = nccl_bands.leave_a_scale_in(traces, "the cluster's logs", **kwargs)
    covered = replace(cal.calibrated, intervals=intervals, inside=inside) if cal.calibrated is not None else None
    e = cal.errors()
    facts = described(cluster, points, where)
    provenance = {
        "fitted_from": f"every log of {where} ({len(traces)} logs; nodes "
                       f"{', '.join(map(str, facts.nodes_measured))}), {aside} disturbed points set aside: "
                       f"{nccl_corpus.DISTURBED_RULE}",
        "fitted": ", ".join(cal.fitted), "assumed": "; ".join(cal.assumed), "given": "; ".join(cal.given),
        "statistic": "min",
        "residuals": f"{len(e)} points, median |error| {float(np.median(e)):.3f}, worst {float(e.max()):.3f}",
        "command": f"python bench/ship_clusters.py --only {cluster.name}"}
    return f"{cluster.name}.toml", network_file.dumps(cal.network, provenance, calibrated=covered, cluster=facts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(CLUSTERS_DIR))
    parser.add_argument("--only", action="append", help="this cluster only (repeatable)")
    parser.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    parser.add_argument("--ref", default=None, help="the reference set's nccl-tests folder (default: "
                        "nccl_corpus.reference_logs)")
    args = parser.parse_args()
    corpus, ref_facts = ROOT / "bench" / "data" / "nccl-tests", ROOT / "bench" / "data" / "nccl-tests-ref-facts"
    ref = Path(args.ref) if args.ref else nccl_corpus.reference_logs(ROOT)
    clusters = nccl_corpus.discover(corpus, ref_facts, ref)
    if ref is None:
        print("# the reference set is not here: its clusters are left out", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    differ = 0
    for c in clusters:
        if args.only and c.name not in args.only:
            continue
        where = (f"the reference set's nccl-tests/{c.name} (facts: bench/data/nccl-tests-ref-facts/{c.name})"
                 if c.reference else f"bench/data/nccl-tests/{c.name}")
        name, text = ship(c, where)
        facts = ClusterFacts.from_toml(tomllib.loads(text)["cluster"], name)
        print(f"  {c.name}  {facts.describe()}")
        if args.check:
            old = (out / name).read_text() if (out / name).is_file() else ""
            if old != text:
                differ += 1
                print(f"# {out / name} would change")
        else:
            network_file_path = out / name
            network_file_path.write_text(text)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
