"""Golden numbers: every shipped experiment, and every training algorithm on each path it takes, gives the numbers
it gave when this file's golden was written, bit for bit.

Pinned per run: every field of `Result.summary()` (floats as float.hex, so one bit of difference fails), and a
SHA-256 of the per (rank, iteration) frame and of the per-interval frame (CSV, whose floats Python writes in their
shortest exact form). The shipped experiments are notebooks/experiments/*.toml, simfog/data/default.toml and
bench/*.toml; the GoogLeNet ones read traces that `simfog import` makes from bench/data/ref. The matrix (`MATRIX`)
runs each registered algorithm, and the variants that take another evaluator (several streams, fluid point-to-point
sharing, Horovod's cycles, overheads, stragglers), on a small cluster with drawn compute, by default (the closed
form where it applies) and on the event engine.

The golden was generated on the code before the restructuring by algorithm family (issue 24) and must not change
with it. Regenerate only for a change that is meant to change numbers, and say so in the commit:

    python tests/test_golden_summaries.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "summaries.json"
SHIPPED = sorted([*(REPO / "notebooks" / "experiments").glob("*.toml"), REPO / "simfog" / "data" / "default.toml",
                  *(REPO / "bench").glob("*.toml")])
MATRIX_BASE = REPO / "bench" / "engine-resnet50-cpu.toml"  # ResNet-50 measured on CPU, compute drawn per rank

# (name, comm changes, heterogeneity changes) on 2 nodes x 4 ranks, 3 iterations, NICs of 1 Gbit/s (communication
# then takes about as long as compute: neither hides the other).
MATRIX = [
    ("allreduce-ddp", {}, {}),
    ("allreduce-wfbp-hierarchical", {"merge": "wfbp", "collective": "hierarchical"}, {}),
    ("allreduce-mgwfbp-tree", {"merge": "mgwfbp", "collective": "tree"}, {}),
    ("allreduce-threshold-rhd", {"merge": "threshold", "threshold_bytes": 8 * 2**20, "collective": "rhd"}, {}),
    ("allreduce-bagua-nccl", {"merge": "bagua", "collective": "nccl"}, {}),
    ("allreduce-single-ps", {"merge": "single", "collective": "ps"}, {}),
    ("allreduce-horovod", {"merge": "horovod"}, {}),
    ("allreduce-streams2", {"streams": 2}, {}),
    ("allreduce-overheads", {"bucket_copy_Bps": 5e9, "collective_overhead_s": 50e-6, "overlap_slowdown": 1.2}, {}),
    ("allreduce-stragglers", {}, {"straggler_rate": 0.3, "straggler_delay_s": 2e-3,
                                  "rank_slowdown": ((3, 1.5),)}),
    ("horovod-overheads", {"merge": "horovod", "bucket_copy_Bps": 5e9, "collective_overhead_s": 50e-6}, {}),
    ("fp16", {"algorithm": "fp16"}, {}),
    ("bytegrad", {"algorithm": "bytegrad"}, {}),
    ("qadam", {"algorithm": "qadam"}, {}),
    ("powersgd", {"algorithm": "powersgd", "powersgd_rank": 2}, {}),
    ("fsdp", {"algorithm": "fsdp"}, {}),
    ("fsdp-model-prefetch2", {"algorithm": "fsdp", "fsdp_unit": "model", "prefetch": 2,
                              "reshard_after_forward": False}, {}),
    ("hsdp", {"algorithm": "hsdp"}, {}),
    ("zero1", {"algorithm": "zero1"}, {}),
    ("zero2-overlap", {"algorithm": "zero2", "overlap_comm": True, "reduce_bucket_size": 2_000_000}, {}),
    ("zero3", {"algorithm": "zero3"}, {}),
    ("fsdp-stragglers", {"algorithm": "fsdp"}, {"straggler_rate": 0.3, "straggler_delay_s": 2e-3}),
    ("neighbor", {"algorithm": "neighbor"}, {}),
    ("neighbor-atc", {"algorithm": "neighbor", "combine": "atc"}, {}),
    ("neighbor-fluid", {"algorithm": "neighbor", "p2p_sharing": "fluid"}, {}),
    ("hierarchical_neighbor", {"algorithm": "hierarchical_neighbor"}, {}),
    ("decentralized", {"algorithm": "decentralized"}, {}),
    ("decentralized-shift_one", {"algorithm": "decentralized", "topology": "shift_one"}, {}),
    ("low_precision_decentralized", {"algorithm": "low_precision_decentralized"}, {}),
    ("win_put", {"algorithm": "win_put"}, {}),
    ("win_put-fluid", {"algorithm": "win_put", "p2p_sharing": "fluid"}, {}),
    ("wagma", {"algorithm": "wagma", "group_size": 2, "global_every": 2}, {}),
    ("wagma-blocking", {"algorithm": "wagma", "group_size": 4, "wait_for_group": True}, {}),
    ("async", {"algorithm": "async", "async_period_s": 0.05}, {}),
]
PATHS = (None, "events")


def _value(v, roots: dict):
    """A summary value as JSON keeps it exactly: floats as float.hex, paths under `roots` ({folder: name})
    relative to it."""
    if isinstance(v, float):
        return {"hex": v.hex()}
    if isinstance(v, str):
        for root, name in roots.items():
            if v.startswith(str(root)):
                return name + v[len(str(root)):]
    if isinstance(v, list | tuple):
        return [_value(x, roots) for x in v]
    if isinstance(v, dict):
        return {k: _value(x, roots) for k, x in v.items()}
    return v


def fingerprint(result, tmp: Path | None = None) -> dict:
    """What is pinned of one run: its summary (exact) and digests of its two frames. `tmp`: the folder its inputs
    were made in."""
    def digest(df) -> str:
        return hashlib.sha256(df.to_csv(index=False).encode()).hexdigest()

    roots = {REPO: "<repo>", **({tmp: "<tmp>"} if tmp is not None else {})}
    return {"summary": _value(result.summary(), roots), "iterations_sha256": digest(result.iterations()),
            "intervals_sha256": digest(result.intervals())}


def _googlenet(path: Path, tmp: Path):
    """A GoogLeNet experiment with the traces its header's commands import from bench/data/ref."""
    from simfog import experiment
    from tests.test_mgwfbp_reproduction import import_inputs

    nodes = int(path.stem.rsplit("-", 1)[1])
    text, base = import_inputs(nodes, tmp)
    return experiment.from_dict(tomllib.loads(text), base_dir=base, source=path.name)


def shipped_runs(tmp: Path) -> dict:
    """name -> fingerprint of every shipped experiment as it stands."""
    from simfog import experiment
    from simfog.simulation import simulate

    out = {}
    for i, path in enumerate(SHIPPED):
        name = str(path.relative_to(REPO))
        if path.name.startswith("googlenet-"):
            exp = _googlenet(path, tmp / str(i))
        else:
            exp = experiment.load(path)
        out[name] = fingerprint(simulate(exp), tmp / str(i))
    return out


def matrix_experiment(comm: dict, hetero: dict):
    from simfog import experiment

    exp = experiment.load(MATRIX_BASE)
    cluster = exp.cluster
    exp = replace(exp, iterations=3, cluster=replace(cluster, nodes=2, ranks_per_node=4,
                                                     nic=cluster.nic.with_bandwidth(1e9 / 8)))
    if hetero:
        exp = replace(exp, heterogeneity=replace(exp.heterogeneity, **hetero))
    return exp.with_comm(**comm)


def matrix_run(name: str, path: str | None) -> dict | str:
    """The fingerprint of one matrix entry on `path`, or the one-line reason the path refuses it."""
    from simfog.simulation import simulate

    _, comm, hetero = next(m for m in MATRIX if m[0] == name)
    try:
        return fingerprint(simulate(matrix_experiment(comm, hetero), path=path))
    except ValueError as e:  # a path that cannot run this configuration (its message is tested elsewhere)
        return f"refused: {type(e).__name__}"


def _key(name: str, path: str | None) -> str:
    return f"{name}@{path or 'default'}"


def _golden() -> dict:
    if not GOLDEN.is_file():
        pytest.fail(f"no golden {GOLDEN.relative_to(REPO)}: python tests/test_golden_summaries.py --write")
    return json.loads(GOLDEN.read_text())


def _same(got, want, where: str) -> None:
    if got == want:
        return
    if isinstance(got, dict) and isinstance(want, dict) and "summary" in want and isinstance(got.get("summary"), dict):
        changed = {k: (want["summary"].get(k), got["summary"].get(k))
                   for k in set(got["summary"]) | set(want["summary"])
                   if got["summary"].get(k) != want["summary"].get(k)}
        frames = [k for k in ("iterations_sha256", "intervals_sha256") if got[k] != want[k]]
        pytest.fail(f"{where}: summary fields changed (golden, now): {changed}; frames changed: {frames}")
    pytest.fail(f"{where}: golden {want!r}, now {got!r}")


def test_the_golden_covers_every_shipped_experiment_and_every_algorithm():
    from simfog import algorithms

    golden = _golden()
    assert {str(p.relative_to(REPO)) for p in SHIPPED if not p.name.startswith("googlenet-")} <= set(golden["shipped"])
    assert {comm.get("algorithm", "allreduce") for _, comm, _ in MATRIX} == set(algorithms.REGISTRY.names())
    assert set(golden["matrix"]) == {_key(n, p) for n, _, _ in MATRIX for p in PATHS}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_a_shipped_experiment_gives_its_golden_numbers(path, tmp_path):
    from simfog import experiment
    from simfog.simulation import simulate

    name = str(path.relative_to(REPO))
    if path.name.startswith("googlenet-"):
        exp = _googlenet(path, tmp_path)
    else:
        exp = experiment.load(path)
    _same(fingerprint(simulate(exp), tmp_path), _golden()["shipped"][name], name)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p or "default")
@pytest.mark.parametrize("name", [m[0] for m in MATRIX])
def test_every_algorithm_gives_its_golden_numbers_on_each_path(name, path):
    key = _key(name, path)
    _same(matrix_run(name, path), _golden()["matrix"][key], key)


def write(tmp: Path) -> None:
    """Write the golden from the code as it stands."""
    golden = {"shipped": shipped_runs(tmp),
              "matrix": {_key(n, p): matrix_run(n, p) for n, _, _ in MATRIX for p in PATHS}}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN.relative_to(REPO)}: {len(golden['shipped'])} shipped, {len(golden['matrix'])} matrix runs")


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp))
