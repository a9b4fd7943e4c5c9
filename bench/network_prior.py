"""Learn simfog's prior for networks nobody measured (simfog.nccl.prior) from the public nccl-tests corpus, and say
how it does on clusters it was not learned from.

Each cluster of the corpus (bench/nccl_corpus.py) with NICs and a NIC rate (stated, or inferred by its facts, which
say so) contributes its shipped calibration (simfog/data/clusters/NAME.toml, every log: bench/ship_clusters.py):
its efficiency = the calibrated inter-node bus bandwidth / (NICs x their nominal rate), and its latencyInter. A
transport's prior is the geometric mean of its clusters' efficiencies (for TCP sockets, bound by the CPU: of their
delivered rates per NIC, a cap) and the median of their latencies; the pooled prior, every cluster's (a fraction).

Held out by cluster: every multi-node log of cluster c (every size, disturbed points set aside as the bench does; the
one-node logs measure no link) is predicted from the hardware its facts state and (a) the prior of its transport
learned from the OTHER clusters (the pooled prior of the others where none of them has that transport), (b) the
pooled prior of the others. Per
cluster: the efficiency, the prior it got, the median and worst |error|, and the share of its points inside the
90 % band fitted on the other clusters' scores (conformal per size regime) with that band's median relative
half-width. Last line: `clusters=<n> points=<n> median=<pct> coverage90=<pct> halfwidth90=<pct>` for (a).

--write FILE writes the table simfog ships (simfog/data/network_prior.toml): each transport's prior and the pooled
one learned from every cluster, and the bands of every cluster's held-out scores under (a) "stated" and (b)
"unstated".

Run: python bench/network_prior.py [--write simfog/data/network_prior.toml] [--ref DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nccl_corpus  # noqa: E402  (bench/ is not a package)
from ship_clusters import TRANSPORT, fact  # noqa: E402

from simfog import network_file, units  # noqa: E402
from simfog.bands import SIZE_REGIMES, HalfWidths, conformal_quantile  # noqa: E402
from simfog.nccl import bands as nccl_bands  # noqa: E402
from simfog.nccl import fit as nccl_fit  # noqa: E402
from simfog.nccl.clusters import CLUSTERS_DIR  # noqa: E402
from simfog.nccl.facts import resolve  # noqa: E402
from simfog.nccl.network import NcclNetwork  # noqa: E402
from simfog.nccl.prior import POOLED, Prior, unmeasured_network  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LEVEL = 0.9


def hardware(cluster: nccl_corpus.Cluster, traces: list) -> NcclNetwork | None:
    """The cluster's hardware as its facts give it (nccl_corpus.fit_arguments), its NICs and their rate from the
    facts even where inferred (a prior scales a nominal rate; the inference is in the facts); None without them."""
    kwargs = nccl_corpus.fit_arguments(cluster.facts)[0]
    nics, rate = fact(cluster.facts, "nics_per_node"), fact(cluster.facts, "nic_bandwidth")
    if nics is None or rate is None:
        return None
    kwargs |= {"nics_per_node": int(nics[0]), "nic_Bps": units.bandwidth(str(rate[0]), field="nic_bandwidth")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        facts = resolve(traces, {**{k: None for k in ("channels",)}, **kwargs})
    return NcclNetwork(1e9, 1e9, **facts.hardware)


CAPPED = ("tcp",)  # transports bound by the CPU, not the line (simfog.nccl.prior): a rate per NIC, not a fraction


def learn(rows: dict[str, dict], names: list[str], transport: str | None) -> tuple[tuple, float | None]:
    """((efficiency, latencyInter s, clusters), cap B/s or None) of the prior learned from `names` (of
    `transport`; None: all, a fraction)."""
    use = tuple(n for n in names if transport is None or rows[n]["transport"] == transport)
    e = float(np.exp(np.mean([math.log(rows[n]["efficiency"]) for n in use])))
    cap = None
    if transport in CAPPED:
        cap = float(np.exp(np.mean([math.log(rows[n]["efficiency"] * rows[n]["hardware"].nic_Bps) for n in use])))
    return (e, float(np.median([rows[n]["latency_inter_s"] for n in use])), use), cap


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", metavar="FILE", help="write the shipped table (simfog/data/network_prior.toml)")
    parser.add_argument("--ref", default=None, help="the reference set's nccl-tests folder")
    args = parser.parse_args()
    ref = Path(args.ref) if args.ref else nccl_corpus.reference_logs(ROOT)
    clusters = nccl_corpus.discover(ROOT / "bench" / "data" / "nccl-tests",
                                    ROOT / "bench" / "data" / "nccl-tests-ref-facts", ref)
    rows: dict[str, dict] = {}
    for c in clusters:
        traces, _ = nccl_corpus.every_log(c)
        hw = hardware(c, traces)
        shipped = CLUSTERS_DIR / f"{c.name}.toml"
        if hw is None or not shipped.is_file():
            print(f"# {c.name}: left out ({'no NICs or NIC rate in its facts' if hw is None else 'not shipped'})")
            continue
        net = network_file.load(shipped).nccl
        rows[c.name] = {"traces": traces, "hardware": hw, "transport": TRANSPORT[str(fact(c.facts, "transport")[0])],
                        "efficiency": net.inter_bus_Bps / (hw.nics_per_node * hw.nic_Bps),
                        "latency_inter_s": net.latency_inter_s}
    names = sorted(rows)
    scores: dict[str, dict[str, dict]] = {"stated": {}, "unstated": {}}
    points: dict[str, dict[str, list]] = {"stated": {}, "unstated": {}}
    got: dict[str, tuple] = {}
    for name in names:
        others = [n for n in names if n != name]
        t = rows[name]["transport"]
        same = [n for n in others if rows[n]["transport"] == t]
        for kind, (learned, cap) in (("stated", learn(rows, others, t) if same else learn(rows, others, None)),
                                     ("unstated", learn(rows, others, None))):
            p = Prior(t if kind == "stated" and same else POOLED, *learned, HalfWidths({}, {}, ""), cap_Bps=cap)
            net = unmeasured_network(rows[name]["hardware"], p)
            pts = [q for q in nccl_fit.predict(net, rows[name]["traces"]) if q.nodes > 1]  # the links' part
            points[kind][name] = pts
            scores[kind][name] = nccl_bands.scores_by_regime(pts)
            if kind == "stated":
                got[name] = (p.transport, f"{learned[0]:.2f}" if cap is None else units.format_bandwidth(cap),
                             learned[2])
    print(f"{len(names)} clusters; each predicted from its hardware and the prior of its transport learned from the "
          f"others (a network nobody measured); {LEVEL:.0%} bands fitted on the other clusters' scores")
    print(f"{'cluster':24s} {'transport':9s} {'eff.':>5s}  {'prior (others)':28s} {'points':>6s} {'median':>7s} "
          f"{'worst':>7s} {'cov90':>6s} {'hw90':>6s}")
    every, inside, widths = [], [], []
    for name in names:
        pts = points["stated"][name]
        err = np.array([abs(p.rel_error) for p in pts])
        ins, wid = held_out_band(pts, scores["stated"], name)
        every += list(err)
        inside += ins
        widths += wid
        t, e, used = got[name]
        print(f"{name:24s} {rows[name]['transport']:9s} {rows[name]['efficiency']:5.2f}  "
              f"{(t + ' ' + e + ' of ' + str(len(used))):28s} {len(pts):6d} "
              f"{100 * np.median(err):6.1f}% {100 * err.max():6.1f}% {100 * np.mean(ins):5.1f}% "
              f"{100 * np.median(wid):5.1f}%")
    for t in sorted({r["transport"] for r in rows.values()}):
        (e, lat, used), cap = learn(rows, names, t)
        print(f"# {t}: efficiency {e:.3f}" + (f" (cap {units.format_bandwidth(cap)} per NIC)" if cap else "")
              + f", latencyInter {units.format_time(lat)} from {', '.join(used)}")
    (e, lat, used), _ = learn(rows, names, None)
    print(f"# pooled: efficiency {e:.3f}, latencyInter {units.format_time(lat)} from {len(used)} clusters")
    print(f"clusters={len(names)} points={len(every)} median={100 * np.median(every):.1f} "
          f"coverage90={100 * np.mean(inside):.1f} halfwidth90={100 * np.median(widths):.1f}")
    if args.write:
        write(Path(args.write), rows, names, scores)
    return 0


def held_out_band(pts: list, scores: dict[str, dict[str, list[float]]], name: str) -> tuple[list[bool], list[float]]:
    """Each point of cluster `name` inside the LEVEL band of the other clusters' scores (per size regime; too few
    there: every regime's together), and that band's relative half-width."""
    others = {r: [x for n, by in scores.items() if n != name for x in by[r]] for r, _ in SIZE_REGIMES}
    every = [x for v in others.values() for x in v]
    inside, widths = [], []
    for p in pts:
        regime = nccl_bands.size_regime(p.bytes)
        w = conformal_quantile(others[regime], LEVEL) if others[regime] else None
        w = conformal_quantile(every, LEVEL) if w is None else w
        inside.append(bool(abs(math.log(p.measured_s / p.predicted_s)) <= w))
        widths.append(nccl_bands.relative_half_width(w))
    return inside, widths


def write(path: Path, rows: dict, names: list[str], scores: dict) -> None:
    """The shipped table (simfog.nccl.prior.priors)."""
    def value(v) -> str:
        return json.dumps(v) if isinstance(v, str) else "[" + ", ".join("nan" if x != x else repr(x) for x in v) + "]"

    lines = ["# simfog's prior for networks nobody measured (simfog.nccl.prior), learned from the public nccl-tests",
             "# corpus. Generated; do not edit. Regenerate: python bench/network_prior.py --write "
             "simfog/data/network_prior.toml"]
    for t in sorted({r["transport"] for r in rows.values()}):
        (e, lat, used), cap = learn(rows, names, t)
        lines += ["", f"[transport.{t}]", f"efficiency = {e:.4f}", f'latency_inter = "{lat * 1e6:.4g}us"',
                  f"clusters = {json.dumps(list(used))}"] + ([f'cap = "{cap * 8 / 1e9:.4g}Gbit/s"'] if cap else [])
    (e, lat, used), _ = learn(rows, names, None)
    lines += ["", f"[{POOLED}]", f"efficiency = {e:.4f}", f'latency_inter = "{lat * 1e6:.4g}us"',
              f"clusters = {json.dumps(list(used))}"]
    for kind, what in (("stated", "its transport's prior"), ("unstated", "the pooled prior")):
        by = scores[kind]
        pooled = {r: [x for one in by.values() for x in one[r]] for r, _ in SIZE_REGIMES}
        n = sum(len(v) for v in pooled.values())
        table = HalfWidths.from_scores(pooled, f"{n} points of {len(by)} public clusters, each predicted from its "
                                               f"hardware and {what} learned without it")
        lines += ["", f"[widths.{kind}]", *[f"{k} = {value(v)}" for k, v in table.to_toml().items()]]
    lines += ["", "[provenance]", f"clusters = {json.dumps(names)}",
              "efficiency = " + value("calibrated inter-node bus bandwidth / (NICs x nominal rate), from the shipped "
                                      "calibrations (simfog/data/clusters)"),
              "nominal_rates = {" + ", ".join(
                  f"{json.dumps(n)} = {json.dumps(units.format_bandwidth(rows[n]['hardware'].nic_Bps))}"
                  for n in names) + "}"]
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
