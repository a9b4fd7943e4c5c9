"""Malformed inputs through the `simfog` command and the Python API: every one must end with exit code 2 and one
line on stderr (from Python: a simfog.ConfigError naming the argument).

Inputs are mutations of what the project ships and reads: the model and network traces in traces/, the
experiments (the embedded default and notebooks/experiments), the plan catalogue, the reference logs in
bench/data/ref, plus bad command-line options, non-regular input files and bad output paths; and
(issue 22) the Python API's arguments, calibrated network files, the sharded algorithms' knobs, benchmark logs
with zero times or impossible importer options, and sweep CSVs torn by a kill; and (issue 35) [fabric] tables at
and past their bounds, output paths that cannot be made (/proc, /sys, names over 255 bytes, paths over 4 KiB,
empty ones) for every command and simfog.sweep, the jobs API and Experiment.with_comm with what no file can say,
retarget at the edges of its options, count lists typed wrong, and calibrate --nvls where NVLS cannot run. Each
family below builds inputs that are malformed by construction, so exit 0 is always wrong for them (except the
Kineto and retarget_outputs families, whose inputs a command may take: there exit 0 must write a trace that loads;
sweep_resume, whose resumed sweep must exit 0 with the CSV the uninterrupted sweep wrote; and calibrate_flags,
whose exit 0 must come with a warning that names nvls).

Each input runs in-process through simfog.cli.main(argv) (or the API call) in its own folder, under a per-input
alarm so a hang is reported rather than waited out. Outcomes:
  clean      exit 2, one line `simfog...: error: ...` naming the file or option, nothing written
  ok         exit 0 where that is allowed and the output loads / is the expected one / the warning is given
  traceback  an exception escaped main()
  silent     exit 0 for malformed input, or an exit without exactly one error line, or output written
  vague      a clean error that does not name the file or option it is about
  hang       over the per-input time limit

    python bench/fuzz.py                 # 4,800 inputs (200 per family), seed 0
    python bench/fuzz.py -n 5000 --seed 7 --show 20
    python bench/fuzz.py -n 200 --families fabric,jobs_api

The last line is `tried=<n> tracebacks=<n> silent=<n> hangs=<n>`. tests/test_fuzz_cli.py runs the same
families through hypothesis in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
import tomllib
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "bench" / "data" / "ref"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BIG = 10**400          # a 400-digit integer
NAN, INF = float("nan"), float("inf")
DELETE = object()      # a breaker value: remove the key


@dataclass
class Case:
    family: str
    argv: list[str]
    names: tuple[str, ...] = ()   # the message must contain one of these (the file or option at fault)
    may_succeed: bool = False     # exit 0 allowed (then `output` must load as a trace, or `verify` pass)
    output: str | None = None
    call: Callable[[], object] | None = None  # a Python API call instead of argv: must raise simfog.ConfigError
    verify: Callable[[Path], str | None] | None = None  # after exit 0: what is wrong with the result, or None
    warns: str | None = None      # after exit 0: a `simfog: warning:` line must name this


@dataclass
class Outcome:
    kind: str            # clean, ok, traceback, silent, vague, hang
    rc: object
    stderr: str
    detail: str = ""


# ---- the corpus: what the project ships ----

@cache
def corpus() -> dict:
    from simfog import files

    model = [files.read_json(ROOT / "traces" / n) for n in ("mlp-cpu-b1024.json.gz", "resnet20-cpu-b32.json.gz")]
    net = [files.read_json(ROOT / "traces" / "net-gloo-loopback.json.gz")]
    exps = [tomllib.loads((ROOT / "simfog" / "data" / "default.toml").read_text())]
    exps += [tomllib.loads(p.read_text()) for p in sorted((ROOT / "notebooks" / "experiments").glob("*.toml"))]
    for e in exps:  # a small trace beside the experiment, layer times fixed: malformed inputs fail fast
        e["workload"] = {"trace": "t.json", "compute": "mean"}
        e["iterations"] = 2
    catalogue = tomllib.loads((ROOT / "simfog" / "data" / "catalogue.toml").read_text())
    logs = sorted(p for p in REF.rglob("*") if p.is_file() and p.suffix in (".log", ".nccl")) if REF.is_dir() else []
    kineto = [REF / "gloo-ddp-cpu" / "rank0.json.gz"] if (REF / "gloo-ddp-cpu" / "rank0.json.gz").is_file() else []
    return {"model": model, "net": net, "exps": exps, "catalogue": catalogue, "logs": logs, "kineto": kineto}


def dump_toml(d: dict) -> str:
    """A small TOML writer for the corpus' shapes: scalars, lists and inline tables under [sections]."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            return "nan" if math.isnan(v) else ("inf" if v == INF else "-inf" if v == -INF else repr(v))
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(str(k))} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(type(v))

    key = json.dumps  # quoted keys: any name the mutations use stays one key
    lines, tables = [], []
    for k, v in d.items():
        if isinstance(v, dict):
            tables += [f"[{key(k)}]"] + [f"{key(str(a))} = {value(b)}" for a, b in v.items()]
        elif isinstance(v, list) and v and all(isinstance(t, dict) for t in v):
            for t in v:
                tables += [f"[[{key(k)}]]"] + [f"{key(str(a))} = {value(b)}" for a, b in t.items()]
        else:
            lines.append(f"{key(k)} = {value(v)}")
    return "\n".join(lines + tables) + "\n"


def _copy(x):
    return json.loads(json.dumps(x))


def _set(d, path: tuple, v) -> None:
    for k in path[:-1]:
        d = d[k]
    if v is DELETE:
        d.pop(path[-1], None) if isinstance(d, dict) else d.pop(path[-1])
    else:
        d[path[-1]] = v


def _write(d: Path, name: str, data) -> str:
    p = d / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    elif name.endswith(".gz"):
        p.write_bytes(gzip.compress(data.encode(), mtime=0))
    else:
        p.write_text(data)
    return name


def _exp_file(d: Path, rng: random.Random, trace_name: str = "t.json", name: str = "e.toml", **changes) -> str:
    e = _copy(rng.choice(corpus()["exps"]))
    e["workload"]["trace"] = trace_name
    e.update(changes)
    return _write(d, name, dump_toml(e))


def _good_trace(d: Path, rng: random.Random, name: str = "t.json") -> str:
    return _write(d, name, json.dumps(rng.choice(corpus()["model"])))


# ---- breakers: each makes the input invalid ----

def break_model_trace(t: dict, rng: random.Random) -> None:
    layers = t["layers"]
    i = rng.randrange(len(layers))
    with_params = [k for k, layer in enumerate(layers) if layer["params"]]
    j = rng.choice(with_params)
    bad_time = rng.choice([NAN, INF, -INF, -1.0, 1e308, 1e10, "0.1", None, True, BIG, [], {}])
    pick = rng.randrange(19)
    if pick == 17:
        t["grad_ready_order"][rng.randrange(len(t["grad_ready_order"]))] = rng.choice([{"a": 1}, 5, None, ["x"]])
    elif pick == 18:  # no compute in some recorded iteration (0 s, or a subnormal time)
        k = rng.randrange(len(layers[0]["forward_s"]))
        for layer in layers:
            layer["forward_s"][k] = layer["backward_s"][k] = 0.0
        layers[0]["backward_s"][k] = rng.choice([0.0, 5e-324, 1e-12])
    elif pick == 0:
        layers[i][rng.choice(["forward_s", "backward_s"])][0] = bad_time
    elif pick == 1:
        layers[0]["forward_s"].append(0.001)  # a sample count that differs from the layer's backward_s
    elif pick == 2:
        layers[j]["params"][0]["elements"] = rng.choice([0, -1, 1.5, "10", None, True, 2**53 + 1, BIG])
    elif pick == 3:
        layers[j]["params"][0]["dtype"] = rng.choice(["float128", 3, None, ""])
    elif pick == 4:
        k = rng.choice([k for k in with_params if k != j] or [j])
        extra = dict(layers[k]["params"][0])
        layers[j]["params"].append(extra)  # the same parameter name twice
    elif pick == 5:
        _set(t, (rng.choice(["format", "layers", "model", "batch_size", "dtype", "device", "software", "provenance",
                             "grad_ready_order"]),), DELETE)
    elif pick == 6:
        _set(t, ("provenance", rng.choice(["command", "date", "host", "source", "estimated"])),
             rng.choice([DELETE, 5, None]))
    elif pick == 7:
        t["batch_size"] = rng.choice([0, -1, 1.5, "32", BIG, True, None])
    elif pick == 8:
        order = t["grad_ready_order"]
        choice = rng.randrange(4)
        if choice == 0:
            order.pop(rng.randrange(len(order)))
        elif choice == 1:
            order.append("no.such.parameter")
        elif choice == 2:
            order.append(order[0])
        else:
            t["grad_ready_order"] = "all"
    elif pick == 9:
        t["layers"] = rng.choice([[], {}, "x", None])
    elif pick == 10:
        for layer in layers:
            layer["params"] = []
        t["grad_ready_order"] = []
    elif pick == 11:
        t["format"] = rng.choice(["simfog.model-trace/2", None, 1, "simfog.network-trace/1"])
    elif pick == 12:
        t["provenance"]["source"] = "guessed" if rng.random() < 0.5 else t["provenance"]["source"]
        t["provenance"]["estimated"] = "yes"
    elif pick == 13:
        t[rng.choice(["device", "software"])] = rng.choice([[], "x", 5])
    elif pick == 14:
        t["optimizer_s"] = rng.choice([[NAN], ["x"], "x", [-1], [1e300]])
    elif pick == 15:
        layers[i]["flops"] = rng.choice([-1, NAN, "x", BIG, INF])
    else:
        layers[i][rng.choice(["name", "forward_s", "backward_s", "params"])] = rng.choice([5, None, {"a": 1}])


def break_net_trace(t: dict, rng: random.Random) -> None:
    ms = t["measurements"]
    m = rng.choice(ms)
    pick = rng.randrange(12)
    if pick == 9:
        m[rng.choice(["bogus", "tim_s", "Bytes", ""])] = rng.choice([1, [1.0], "x"])
    elif pick == 10:
        t[rng.choice(["backend", "transport"])] = rng.choice(["bogus", "ncl", "", "NCCL", "carrier pigeon"])
    elif pick == 11:
        m["time_s"] = [0.0] * len(m["time_s"])
    elif pick == 0:
        m["collective"] = rng.choice(["allfoo", 5, None])
    elif pick == 1:
        m["ranks"] = rng.choice([0, -1, BIG, 1.5, "2"])
    elif pick == 2:
        m["nodes"] = m["ranks"] + rng.randint(1, 5)
    elif pick == 3:
        m["bytes"] = rng.choice([-1, BIG, 1.5, None])
    elif pick == 4:
        m["time_s"] = rng.choice([[], [NAN], [-1.0], ["x"], [1e308], [INF], "x"])
    elif pick == 5:
        t["measurements"] = rng.choice([[], "x", None])
    elif pick == 6:
        t[rng.choice(["backend", "transport"])] = rng.choice([5, None, []])
    elif pick == 7:
        _set(t, (rng.choice(["format", "measurements", "backend", "transport", "provenance"]),), DELETE)
    else:
        for x in ms:
            x["time_s"] = rng.choice([[1.0] * len(x["time_s"]), [5e-324] * len(x["time_s"]), [0.0]])


# (path, bad values): each is invalid whatever the rest of the experiment says.
EXP_BREAKS = [
    (("seed",), [-1, BIG, 1.5, "1", 2**63, True]),
    (("iterations",), [0, -1, 10**7, 1.5, "5", BIG]),
    (("seeds",), [1]),
    (("workload",), [5, "x", [1]]),
    (("workload", "trace"), [5, DELETE, "nope.json", ".", "/dev/zero", "e.toml", "a\0b", "loop"]),
    (("workload", "compute"), ["median", 1]),
    (("workload", "extra"), [1]),
    (("cluster",), [5, DELETE]),
    (("cluster", "nodes"), [0, -1, 1.5, "2", BIG, 10**7, DELETE]),
    (("cluster", "gpus_per_node"), [0, -3, 2.5, "8", BIG]),
    (("cluster", "nic_bandwidth"), [10, "10", "10 furlongs", "-1Gbit/s", "", True, "Gbit/s", "1e3 ms"]),
    (("cluster", "nic_latency"), [5, "5", "-1us", "1 parsec", "us"]),
    (("cluster", "intra_bandwidth"), ["0GB/s", "fast", 150, "1e-300B/s", "1e-4B/s"]),
    (("cluster", "oversubscription"), [0.5, "2", NAN, True, -1, INF]),
    (("cluster", "reduce_bandwidth"), ["0B/s", "x"]),
    (("cluster", "network"), [5, "missing.toml", ".", "e.toml", "a\0b", "loop"]),
    (("cluster", "network_trace"), ["missing.json", ".", "t.json"]),
    (("cluster", "bogus"), [1]),
    (("comm",), [5, [1]]),
    (("comm", "collective"), ["ringo", 1, ""]),
    (("comm", "merge"), ["bogus", None if False else "wfbpp"]),
    (("comm", "algorithm"), ["x", 3]),
    (("comm", "threshold"), [25, "25", "-1MiB", "MiB"]),
    (("comm", "streams"), [0, 1.5, "2", 65, 2**63 - 1, BIG]),
    (("comm", "ps_servers"), [0, -1, 10**6 + 1, 2**63 - 1]),
    (("comm", "topology"), ["blob", 1]),
    (("comm", "combine"), ["xyz"]),
    (("comm", "negotiate"), ["yes", 1]),
    (("comm", "group_size"), [1, 0]),
    (("comm", "consensus_eps"), [1.5, NAN, 0, "0.1"]),
    (("comm", "overlap_slowdown"), [0.5, NAN, INF, "2"]),
    (("comm", "nccl_algo"), ["foo", [], 5]),
    (("comm", "encode_bandwidth"), ["0GB/s", 5]),
    (("comm", "async_period"), ["0s", "x"]),
    (("comm", "bogus"), [1]),
    (("heterogeneity", "rank_slowdown"), [{"999": 1.5}, {"0": -1}, {"x": 2}, 5, {"0": NAN}, {"0": "2"}]),
    (("heterogeneity", "node_slowdown"), [{"99": 2.0}, {"0": 0}, {"0": 1e-300}, {"0": 1e300}]),
    (("heterogeneity", "straggler_rate"), [2, -0.1, NAN, "0.5"]),
    (("heterogeneity", "straggler_distribution"), ["cauchy"]),
    (("heterogeneity", "degraded_nics"), [{"0": "fast"}, {"99": "1Gbit/s"}]),
    (("heterogeneity", "bogus"), [1]),
]


def break_experiment(e: dict, rng: random.Random, d: Path) -> None:
    path, values = rng.choice(EXP_BREAKS)
    if "loop" in values and not os.path.lexists(d / "loop"):
        os.symlink("loop", d / "loop")  # a symlink to itself: resolving it never ends
    if path[0] == "heterogeneity":
        e.setdefault("heterogeneity", {})
    if len(path) > 1:
        e.setdefault(path[0], {})
        if not isinstance(e[path[0]], dict):
            e[path[0]] = {}
    value = rng.choice(values)
    _set(e, path, value)
    if path == ("cluster", "network"):  # network and nic settings together are fine; make the file the fault
        e["cluster"].pop("network_trace", None)
    # Pairs that are only wrong together.
    if rng.random() < 0.1:
        e.setdefault("comm", {})
        if isinstance(e["comm"], dict):
            e["comm"].update(rng.choice([{"merge": "threshold"}, {"collective": "linear"},
                                         {"mpi_switch": "64KiB", "collective": "ring"},
                                         {"streams": 2, "algorithm": "gossip"}]))
            e["comm"].pop("threshold", None)
            e["comm"].pop("alpha", None)


CATALOGUE_BREAKS = [
    (("currency",), [5, DELETE, ""]),
    (("option",), [[], 5, DELETE]),
    (("bogus",), [1]),
    (("option", 0, "gpus_per_node"), [0, "8", BIG, 1.5, DELETE]),
    (("option", 0, "max_nodes"), [0, -1, DELETE]),
    (("option", 0, "price_per_gpu_hour"), [-1, NAN, "2", DELETE, INF]),
    (("option", 0, "oversubscription"), [0.5, "x", INF]),
    (("option", 0, "collectives"), [["nope"], "ring", [5], []]),
    (("option", 0, "merges"), [["nope"], 5, []]),
    (("option", 0, "name"), ["", 5, DELETE]),
    (("option", 0, "bogus"), [1]),
    (("option", 0, "nic_bandwidth"), [10, "fast", DELETE, "1e-300B/s", "0B/s", "1e400Gbit/s"]),
    (("option", 0, "network"), ["missing.toml", 5, ".", "a\0b", "loop"]),
]


def break_catalogue(c: dict, rng: random.Random, d: Path) -> None:
    path, values = rng.choice(CATALOGUE_BREAKS)
    if "loop" in values and not os.path.lexists(d / "loop"):
        os.symlink("loop", d / "loop")
    if path[-1] == "name" and rng.random() < 0.3 and len(c["option"]) > 1:
        c["option"][1]["name"] = c["option"][0]["name"]  # duplicate names
        return
    _set(c, path, rng.choice(values))


def break_text(text: str, rng: random.Random) -> bytes:
    """Byte-level damage that no parser may accept: an invalid UTF-8 byte, a cut JSON object, deep nesting."""
    data = text.encode()
    pick = rng.randrange(4)
    if pick == 0:
        k = rng.randrange(len(data))
        return data[:k] + bytes([rng.choice([0xFF, 0xFE, 0xC0])]) + data[k + 1:]
    if pick == 1 and text.lstrip().startswith("{"):
        return data[:rng.randrange(1, len(data.rstrip()) - 1)]
    if pick == 2:
        return gzip.compress(data, mtime=0)  # compressed bytes under a plain name
    return b"[" * 100_000 + b"]" * 100_000 if text.lstrip().startswith("{") else b"a = " + b"[" * 100_000


# ---- families: (rng, folder) -> Case ----

def fam_model_trace(rng, d):
    t = _copy(rng.choice(corpus()["model"]))
    break_model_trace(t, rng)
    name = rng.choice(["t.json", "t.json.gz"])
    _write(d, name, json.dumps(t))
    how = rng.randrange(3)
    if how == 0:
        return Case("model_trace", ["simulate", _exp_file(d, rng, name)], (name,))
    if how == 1:
        return Case("model_trace", ["plan", name, "--target-samples-per-s", "1e9", "-o", "p"], (name,))
    return Case("model_trace", ["retarget", name, "--device", "a100", "-o", "r.json"], (name,))


def fam_trace_bytes(rng, d):
    t = json.dumps(rng.choice(corpus()["model"] + corpus()["net"]))
    _write(d, "t.json", break_text(t, rng))
    if rng.random() < 0.5:
        return Case("trace_bytes", ["simulate", _exp_file(d, rng)], ("t.json",))
    return Case("trace_bytes", ["calibrate", "t.json"], ("t.json",))


def fam_net_trace(rng, d):
    t = _copy(rng.choice(corpus()["net"]))
    break_net_trace(t, rng)
    _write(d, "n.json", json.dumps(t))
    if rng.random() < 0.5:
        return Case("net_trace", ["calibrate", "n.json"] + rng.choice([[], ["--model", "nccl"]]), ("n.json",))
    _good_trace(d, rng)
    e = _copy(rng.choice(corpus()["exps"]))
    e["cluster"].pop("network", None)
    e["cluster"]["network_trace"] = "n.json"
    return Case("net_trace", ["simulate", _write(d, "e.toml", dump_toml(e))], ("n.json",))


def fam_experiment(rng, d):
    _good_trace(d, rng)
    e = _copy(rng.choice(corpus()["exps"]))
    break_experiment(e, rng, d)
    name = _write(d, "e.toml", dump_toml(e))
    cmd = rng.choice([["simulate", name], ["simulate", name, "--json"], ["sweep", name, "--jobs", "1",
                      "--no-progress"], ["curve", name, "--ranks", "2,4", "--jobs", "1", "--no-progress"],
                      ["tune", name, "--points", "3", "--refine", "1"], ["plan", name, "--target-samples-per-s", "1"]])
    return Case("experiment", cmd, (name, "t.json"))  # network_trace = "t.json": the trace file is at fault


def fam_experiment_text(rng, d):
    _good_trace(d, rng)
    text = dump_toml(_copy(rng.choice(corpus()["exps"])))
    pick = rng.randrange(5)
    if pick == 0:
        data = break_text(text, rng)
    elif pick == 1:
        data = (text + "\nseed = 3\n").encode()          # a key given twice
    elif pick == 2:
        lines = text.split("\n")
        lines.insert(rng.randrange(len(lines)), rng.choice(["= =", "[cluster", "x = ", "\"unclosed = 1"]))
        data = "\n".join(lines).encode()
    elif pick == 3:
        data = (ROOT / "traces" / rng.choice(["mlp-cpu-b1024.json.gz", "net-gloo-loopback.json.gz"])).read_bytes()
    else:
        data = json.dumps(rng.choice(corpus()["model"])).encode()
    name = rng.choice(["e.toml", "e.json.gz" if pick == 3 else "e.toml"])
    _write(d, name, data)
    return Case("experiment_text", [rng.choice(["simulate", "sweep", "tune"]), name], (name,))


def _special(d: Path, rng: random.Random, name: str) -> str:
    """A path where a file belongs that is not a readable regular file."""
    kind = rng.randrange(6)
    if kind == 5:
        os.symlink(name, d / name)  # a symlink to itself
    elif kind == 0:
        (d / name).mkdir()
    elif kind == 1:
        os.mkfifo(d / name)
    elif kind == 2:
        return "/dev/zero"
    elif kind == 3:
        (d / name).write_bytes(b"")
    else:
        return f"missing-{name}"
    return name


def fam_special_files(rng, d):
    where = rng.randrange(7)
    if where == 0:
        p = _special(d, rng, "e.toml")
        return Case("special_files", ["simulate", p], (p,))
    if where == 1:
        p = _special(d, rng, "t.json")
        return Case("special_files", ["simulate", _exp_file(d, rng, p)], ("e.toml", p))
    if where == 2:
        p = _special(d, rng, "cat.toml")
        _good_trace(d, rng)
        return Case("special_files", ["plan", "t.json", "--catalogue", p, "--target-samples-per-s", "1"], (p,))
    if where == 3:
        p = _special(d, rng, "n.json")
        return Case("special_files", ["calibrate", p], (p,))
    if where == 4:
        p = _special(d, rng, "x.log")
        kind = rng.choice(["nccl-tests", "osu", "imb", "mgwfbp", "kineto"])
        return Case("special_files", ["import", kind, p, "-o", "o.json"], (p,))
    if where == 5:
        p = _special(d, rng, "net.toml")
        return Case("special_files", ["collective", "allreduce", "--network", p, "--nodes", "2",
                                      "--gpus-per-node", "2"], (p,))
    p = _special(d, rng, "t.json")
    return Case("special_files", ["retarget", p, "--device", "a100", "-o", "r.json"], (p,))


def fam_options(rng, d):
    _good_trace(d, rng)
    e = _exp_file(d, rng)
    cases = [
        (["simulate", e, "--seed", rng.choice(["-1", str(2**63), "x", "1.5"])], "--seed"),
        (["simulate", e, "--iterations", rng.choice(["0", "-3", "1e8", "100000000", "", "x"])], "--iterations"),
        (["simulate", e, "--ranks", rng.choice(["0", "-1", "x", str(10**9), ""])], "ranks"),
        (["simulate", e, "--merge", rng.choice(["bogus", ""])], "--merge"),
        (["simulate", e, "--collective", rng.choice(["bogus", ""])], "--collective"),
        (["simulate", e, "--threshold", rng.choice(["25", "-1MiB", "", "x"])], "--threshold"),
        (["simulate", e, "--timeline", "tl.json", "--timeline-ranks", rng.choice(["x-y", "5-1", "-", "999"])],
         "--timeline-ranks"),
        (["sweep", e, "--jobs", "1", "--no-progress", "--ranks", rng.choice(["", "x", "0", "-2", ",", "4,x"])],
         "--ranks"),
        (["sweep", e, "--jobs", "1", "--no-progress", "--merge", rng.choice(["", "nope", ",,"])], "--merge"),
        (["sweep", e, "--jobs", "1", "--no-progress", "--collective", "nope"], "--collective"),
        (["sweep", e, "--jobs", "1", "--no-progress", "--threshold", rng.choice(["x", "", "5"])], "--threshold"),
        (["sweep", e, "--no-progress", "--jobs", rng.choice(["0", "-1"])], "--jobs"),
        (["curve", e, "--jobs", "1", "--no-progress", "--ranks",
          rng.choice(["", "8,4,...,2", "4,8,...,9", "a,b", "2,3,...,1000000000", "...", "1,2,...", "0,1,...,4"])],
         "--ranks"),
        (["plan", e, "--target-samples-per-s", rng.choice(["nan", "-1", "0", "x", "inf", "1e400"])],
         "--target-samples-per-s"),
        (["plan", e, "--epoch-samples", rng.choice(["inf", "nan", "1e300", "-inf"]), "--epoch-time", "2h"],
         "--epoch-samples"),
        (["sweep", e, "--no-progress", "--jobs", rng.choice(["100000", "1025"])], "--jobs"),
        (["collective", "allreduce", "--network", "x.toml", "--nodes", rng.choice(["99999999999999999999", "1000001"]),
          "--gpus-per-node", "1"], "--nodes"),
        (["plan", e, "--epoch-samples", "100", "--epoch-time", rng.choice(["2", "0s", "x", "-1h"])], "--epoch-time"),
        (["plan", e, "--epoch-time", "2h"], "--epoch-time"),
        (["tune", e, "--points", rng.choice(["0", "-1", "1", "1001", "1000000000"])], "--points"),
        (["tune", e, "--refine", rng.choice(["-1", "1001", "1000000000"])], "--refine"),
        (["tune", e, "--lo", rng.choice(["x", "5", "-1MiB"])], "--lo"),
        (["tune", e, "--lo", "1GiB", "--hi", "1KiB"], "--hi"),
        (["tune", e, "--merge", rng.choice(["wfbp", "single", "bogus"])], "--merge"),  # no knob of its own
        (["tune", e, "--merge", "ddp", "--tolerance", rng.choice(["-1", "100", "nan"])], "--tolerance"),
        (["tune", e, *rng.choice([[], ["--merge", "ddp"]]), "--level", rng.choice(["0", "1", "90", "nan", "-0.5"])],
         "--level"),
        ([rng.choice(["sweep", "curve"]), e, "--ranks", "2", "--jobs", "1", "--no-progress", "--level",
          rng.choice(["0", "1", "90", "nan", "inf"])], "--level"),
        (["plan", e, *rng.choice([["--target-samples-per-s", "100"], ["--gpus", "2"]]), "--confidence",
          rng.choice(["0.5", "1", "90", "nan", "0", "-1"])], "--confidence"),
        (["plan", e, (flag := rng.choice(["--gpus", "--nodes"])), rng.choice(["", "0", "a,b", "-4", "16,,x"])], flag),
        (["collective", rng.choice(["bogus", ""]), "--network", "x.toml", "--nodes", "1", "--gpus-per-node", "2"],
         "OP"),
        (["collective", "allreduce", "--network", "x.toml", "--nodes", rng.choice(["0", "-1"]),
          "--gpus-per-node", "2"], "--nodes"),
        (["import", "nccl-tests", "x.log", "-o", rng.choice(["o.txt", "o"])], "--output"),
        (["import", "osu", "x.log", "-o", "o.json", "-s", rng.choice(["foo=1", "bad", "=3"])], "--set"),
        (["import", "osu", "x.log", "-o", "o.json", "--collective", "allfoo"], "collective"),
        (["import", "kineto", "x.log", "-o", "o.json", "--collective", "allreduce"], "--collective"),
        (["retarget", "t.json", "--device", rng.choice(["nope", ""]), "-o", "r.json"], "device"),
        (["retarget", "t.json", "--device", "a100", "--efficiency", rng.choice(["0", "-1", "nan", "2", "inf"]),
          "-o", "r.json"], "efficiency"),
        (["retarget", "t.json", "--device", "a100", "--launch", rng.choice(["-1us", "x", "1e400s", "nan"]),
          "-o", "r.json"], "--launch"),
        (["retarget", "t.json", "--device", "a100", "--samples-per-s", rng.choice(["0", "-1", "nan", "inf", "x"]),
          "-o", "r.json"], "--samples-per-s"),
        (["calibrate", str(ROOT / "traces" / "net-gloo-loopback.json.gz"), "--model", "nccl", "--channels",
          rng.choice(["0", "65"])], "--channels"),
        (["calibrate", str(ROOT / "traces" / "net-gloo-loopback.json.gz"), "-o", "n.toml"], "--output"),
        (["list", rng.choice(["gizmos", "x"])], "kind"),
        (["simulate", e, "--bogus"], "--bogus"),
        ([rng.choice(["simulat", "", "--x"])], "simfog"),
    ]
    argv, name = rng.choice(cases)
    if argv[0] == "collective" or argv[:2] == ["import", "nccl-tests"] or argv[0] == "import":
        _write(d, "x.toml", "[nccl]\nintra_bus_bandwidth = \"100GB/s\"\ninter_bus_bandwidth = \"10GB/s\"\n")
        (d / "x.log").write_text((REF / "nccl-tests" / "echo-a100-azure" / "nccl_8.log").read_text()
                                 if REF.is_dir() else "# nccl-tests\n")
    return Case("options", argv, (name,))


def fam_outputs(rng, d):
    _good_trace(d, rng)
    e = _exp_file(d, rng)
    (d / "afile").write_text("x")
    (d / "adir").mkdir()
    out = rng.choice(["afile/o", "afile/sub/o", "adir"])
    plain = out.rstrip("/")
    net = str(ROOT / "traces" / "net-gloo-loopback.json.gz")
    cases = [
        ["simulate", e, "--intervals", out + ".csv" if out != "adir" else out],
        ["simulate", e, "--timeline", out + ".json" if out != "adir" else out],
        ["sweep", e, "--jobs", "1", "--no-progress", "-o", plain + (".csv" if out != "adir" else "")],
        ["curve", e, "--ranks", "2,4", "--jobs", "1", "--no-progress", "-o", plain],
        ["tune", e, "--points", "3", "--refine", "1", "-o", plain],
        ["plan", "t.json", "--target-samples-per-s", "1", "-o", plain],
        ["retarget", "t.json", "--device", "a100", "-o", plain + (".json" if out != "adir" else "")],
        ["import", "osu", "x.log", "-o", plain + ".json"],
        ["calibrate", net, "--model", "nccl", "-o", plain + (".toml" if out != "adir" else "")],
    ]
    argv = rng.choice(cases)
    if argv[0] in ("curve", "tune", "plan") and out == "adir":
        # -o names a folder for these: "adir" is a good one; make the CSV it would hold a directory instead
        (d / "adir" / f"{argv[0]}.csv").mkdir()
    if argv[0] == "import":
        if out == "adir":
            (d / "o.json").mkdir()
            argv[-1] = "o.json"
        (d / "x.log").write_text("# OSU MPI Allreduce Latency Test\n# Size       Avg Latency(us)\n4 1.0\n8 2.0\n")
    return Case("outputs", argv, ("afile", "adir", "o.json"))


def fam_catalogue(rng, d):
    _good_trace(d, rng)
    c = _copy(corpus()["catalogue"])
    break_catalogue(c, rng, d)
    _write(d, "cat.toml", dump_toml(c) if rng.random() < 0.9 else break_text(dump_toml(c), rng))
    return Case("catalogue", ["plan", "t.json", "--catalogue", "cat.toml", "--target-samples-per-s", "1e12"],
                ("cat.toml",))


def fam_ref_logs(rng, d):
    logs = corpus()["logs"]
    if not logs:
        return fam_trace_bytes(rng, d)
    src = rng.choice(logs)
    text = src.read_text(errors="replace")
    pick = rng.randrange(3)
    if pick == 0:
        data = break_text(text, rng)
        data = data if b"\xff" in data or b"\xfe" in data or b"\xc0" in data or data[:2] == b"\x1f\x8b" else \
            data + b"\xff"
    elif pick == 1:
        data = b""
    else:
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 2000))) + b"\xff"
    name = "x" + src.suffix
    _write(d, name, data)
    kind = rng.choice(["nccl-tests", "osu", "imb", "mgwfbp"])
    return Case("ref_logs", ["import", kind, name, "-o", "o.json"], (name,))


def fam_kineto(rng, d):
    """Odd Input Dims, duplicated or dropped events in a real Kineto trace: exit 0 with a trace that loads, or
    a clean error."""
    srcs = corpus()["kineto"]
    if not srcs:
        return fam_model_trace(rng, d)
    data = _kineto(srcs[0])
    data = _copy(data)
    if rng.random() < 0.15:  # every event listed twice
        data["traceEvents"] = [e for e in data["traceEvents"] for _ in range(2)]
    events = data["traceEvents"]
    for _ in range(rng.randint(1, 5)):
        pick = rng.randrange(5)
        k = rng.randrange(len(events))
        e = events[k]
        if pick == 0 and isinstance(e.get("args"), dict):
            e["args"]["Input Dims"] = rng.choice([[], [[]], "x", [[-1, 2]], [[BIG]], [[1.5]], [["a"]], None,
                                                  [[[1, 2], [3]]], {"a": 1}])
        elif pick == 1:
            events.insert(k, _copy(e))
        elif pick == 2:
            events.pop(k)
        elif pick == 3 and isinstance(e.get("args"), dict):
            e["args"][rng.choice(["Sequence number", "Input type", "External id"])] = rng.choice(
                [None, "x", -1, BIG, [], [None]])
        else:
            e[rng.choice(["ts", "dur"])] = rng.choice([NAN, -1, "x", None, BIG, 1e308])
    _write(d, "k.json", json.dumps(data))
    return Case("kineto", ["import", "kineto", "k.json", "-o", "o.json"], ("k.json",), may_succeed=True,
                output="o.json")


@cache
def _kineto(path: Path) -> dict:
    from simfog import files

    return files.read_json(path)


def fam_units_overflow(rng, d):
    """Owned by branch i11-correct (simfog/units.py, engine, results): non-finite or overflowing quantities."""
    _good_trace(d, rng)
    e = _copy(rng.choice(corpus()["exps"]))
    key, value = rng.choice([(("cluster", "nic_latency"), "1e400us"), (("cluster", "nic_latency"), "1e308s"),
                             (("cluster", "nic_bandwidth"), "1e400Gbit/s"), (("cluster", "intra_latency"), "1e400s")])
    _set(e, key, value)
    return Case("units_overflow", ["simulate", _write(d, "e.toml", dump_toml(e))], ("e.toml",))


# ---- the new surfaces of issue 22: the Python API, network files, sharded knobs, logs, sweep resume ----

def _api_cases(d: Path, exp_path: Path, rng: random.Random) -> tuple[str, dict, str]:
    """(function, keyword arguments, the field its ConfigError must name): arguments `simfog ...` refuses."""
    (d / "afile").write_text("x")
    (d / "adir").mkdir()
    load_bad = {"path": [5, b"e.toml", "nope.toml", ".", "/dev/zero", 1.5],
                "ranks": [0, -1, "8", 1.5, True, 10**30, BIG], "merge": ["x", 3, "", ["ddp"]],
                "collective": ["x", 3, ""], "threshold": [25, "x", "-1MiB", NAN, "1e400B", "25"],
                "iterations": [0, 1.5, "5", 10**7, True], "seed": [-1, 2**63, "1", True, 1.5]}
    sweep_bad = {"ranks": [[0], ["8"], 3.5, [True], [10**30], []],
                 "merge": [["ddp", 3], [None], [["ddp"]], "", [], 5],
                 "collective": [[None], ["ring", "warp"], "", 5, []],
                 "threshold": [[NAN], [INF], [-1], [BIG], "25", [{"a": 1}], [True], "x", [1e300]],
                 "jobs": ["2", 0, -1, 1.5, True, None, 10**9],
                 "output": [5, ".", "afile/x.csv", "a\0b.csv", b"x.csv", 1.5, "adir"],
                 "progress": ["yes", 1, None]}
    fn = rng.choice(["load", "simulate", "sweep", "sweep"])
    if fn == "simulate":
        return fn, {"experiment": rng.choice([5, {"seed": 1}, None, "nope.toml", 1.5, b"e.toml"])}, ""
    table = load_bad if fn == "load" else sweep_bad
    key = rng.choice(list(table))
    kwargs = {key: rng.choice(table[key])}
    if fn == "load" and key != "path":
        kwargs["path"] = exp_path
    return fn, kwargs, key


def fam_api(rng, d):
    """simfog.load / simulate / sweep with the arguments the command line refuses: each must raise
    simfog.ConfigError naming its keyword (path or experiment for what is no experiment), and write nothing."""
    import simfog

    _good_trace(d, rng)
    exp_path = d / _exp_file(d, rng)
    fn, kwargs, key = _api_cases(d, exp_path, rng)
    if fn == "sweep":
        experiment = exp_path if rng.random() < 0.5 else simfog.load(exp_path)
        call = lambda: simfog.sweep(experiment, **kwargs)  # noqa: E731
    else:
        call = lambda: getattr(simfog, fn)(**kwargs)  # noqa: E731
    shown = {k: (v if not isinstance(v, int) or abs(v) < 10**20 else "<big>") for k, v in kwargs.items()}
    names = (key, "path") if fn == "load" else (key,) if key else ("experiment", "path")  # a bad path: "path"
    return Case("api", [f"simfog.{fn}({shown})"], names, call=call)


def _network_doc() -> dict:
    """A well-formed network file (as `simfog calibrate -o` writes one), as a dict of its sections."""
    from simfog import nccl

    return {"nccl": {"version": ".".join(map(str, nccl.NEWEST)), "gpu_arch": "ampere", "cpu_vendor": "intel",
                     "intra_transport": "nvlink", "channels": 8, "intra_bus_bandwidth": "204GB/s",
                     "inter_bus_bandwidth": "13GB/s", "latency_inter": "2.9us", "launch": "8.8us",
                     "tree_fill": "93KiB", "nvls": False, "collnet": False},
            "p2p": {"nic_flow_bandwidth": "850Mbit/s"}, "provenance": {"fitted_from": "bench/fuzz.py"}}


_BANDWIDTHS = ["1e-300B/s", "1e-4B/s", "0GB/s", "fast", 100, "-1GB/s", "1e400GB/s", "", DELETE]
# (section, key or None for the section itself, bad values): each is wrong whatever the rest of the file says.
NETWORK_BREAKS = [
    ("nccl", "intra_bus_bandwidth", _BANDWIDTHS), ("nccl", "inter_bus_bandwidth", _BANDWIDTHS),
    ("nccl", "latency_inter", ["5", "-1us", "1e400s", 5, "1 parsec"]), ("nccl", "launch", ["x", "-1us"]),
    ("nccl", "tree_fill", ["-1B", "x", 5]), ("nccl", "channels", [0, 65, -1, "8", 1.5, True, BIG]),
    ("nccl", "version", ["9.99", 2.3, ""]), ("nccl", "gpu_arch", ["quantum", 5]),
    ("nccl", "cpu_vendor", ["arm64x"]), ("nccl", "intra_transport", ["carrier"]), ("nccl", "nvls", ["yes", 1]),
    ("nccl", "bogus", [1]), ("p2p", "nic_flow_bandwidth", ["0B/s", "1e-300B/s", "x", 5]), ("p2p", "bogus", [1]),
    ("provenance", None, [5, "x"]), ("bogus", None, [{"a": 1}]), ("nccl", None, [5, DELETE]),
]


def fam_network_file(rng, d):
    """A calibrated network file (`[cluster] network`, `simfog collective --network`, a catalogue option's
    network) that is malformed, or so slow that a run or a collective would last over 1e9 s."""
    doc = _copy(_network_doc())
    slow = rng.random() < 0.15
    if slow:  # well-formed, but one iteration's gradients or one 8 GiB collective take longer than 1e9 s
        doc["nccl"]["inter_bus_bandwidth"] = "1e-3B/s"  # a 940 kB trace's gradients: >= 9.4e8 s an iteration
        doc["p2p"] = {}
    else:
        section, key, values = rng.choice(NETWORK_BREAKS)
        value = rng.choice(values)
        if key is None:
            _set(doc, (section,), value)
        else:
            doc.setdefault(section, {})
            _set(doc, (section, key), value)
    _write(d, "net.toml", dump_toml(doc) if rng.random() < 0.95 else break_text(dump_toml(doc), rng))
    _good_trace(d, rng)
    use = rng.choice(["experiment", "collective"] + ([] if slow else ["catalogue"]))
    if use == "experiment":
        e = _copy(rng.choice(corpus()["exps"]))
        e["cluster"] = {"nodes": 4 if slow else rng.choice([2, 4]), "gpus_per_node": rng.choice([1, 2]),
                        "network": "net.toml"}
        e.pop("comm", None)
        return Case("network_file", ["simulate", _write(d, "e.toml", dump_toml(e))], ("net.toml",))
    if use == "collective":
        sizes = [] if slow else ["--sizes", rng.choice(["1MiB", "8B:8MiB"])]
        return Case("network_file", ["collective", rng.choice(["allreduce", "allgather", "broadcast"]), "--network",
                                     "net.toml", "--nodes", "2", "--gpus-per-node", "2", *sizes], ("net.toml",))
    _write(d, "cat.toml", dump_toml({"currency": "USD", "option": [{
        "name": "x", "gpus_per_node": 2, "max_nodes": 2, "price_per_gpu_hour": 1.0, "network": "net.toml"}]}))
    return Case("network_file", ["plan", "t.json", "--catalogue", "cat.toml", "--target-samples-per-s", "1"],
                ("net.toml",))


_FSDP, _ZERO = ("fsdp", "hsdp"), ("zero1", "zero2", "zero3")
# (algorithms, key, bad values) on a 2 x 2 cluster: each value is wrong for these algorithms.
SHARDED_BREAKS = [
    (("zero1", "zero2"), "allgather_bucket_size", [1, 10, 0, -1, 1.5, "5e8", True, BIG]),
    (_ZERO, "reduce_bucket_size", [0, -1, 1.5, "x", BIG, 2**53 + 1]),
    (("zero3",), "stage3_prefetch_bucket_size", [0, -5, "x", BIG]),
    (_ZERO, "overlap_comm", ["yes", 1]), (("zero1", "zero2"), "zero_reduce", ["scatter", 1]),
    (_FSDP, "fsdp_unit", ["", "x", [0], [], "0MB", 5, [1] * 1000, "-1MB", "1e400MB"]),
    (_FSDP, "prefetch", [-1, "1", 1.5]), (_FSDP, "reshard_after_forward", [1, "true"]),
    (("hsdp",), "hsdp_group", [0, 3, -1, 8]), (_FSDP + _ZERO, "param_dtype", ["float128", 5]),
    (_FSDP + _ZERO, "reduce_dtype", ["int4"]),
    (("fsdp", "zero3"), "allgather_bucket_size", [500_000_000]),   # a knob of another algorithm
    (("zero1", "allreduce"), "fsdp_unit", ["layer"]),
]


def fam_sharded(rng, d):
    """Sharded data parallelism (fsdp, hsdp, zero1-3) with a knob out of range, of the wrong type, or of
    another algorithm; allgather buckets so small that a step would issue more than 10,000 all-gathers."""
    _good_trace(d, rng)
    algorithms, key, values = rng.choice(SHARDED_BREAKS)
    e = _copy(rng.choice(corpus()["exps"]))
    e["cluster"] = {"nodes": 2, "gpus_per_node": 2, "nic_bandwidth": "25Gbit/s"}
    e["comm"] = {"algorithm": rng.choice(algorithms), key: rng.choice(values)}
    name = _write(d, "e.toml", dump_toml(e))
    cmd = rng.choice([["simulate", name], ["sweep", name, "--jobs", "1", "--no-progress", "-o", "s.csv"]])
    return Case("sharded", cmd, ("e.toml",))


def _zero_log_times(text: str) -> str:
    """A benchmark log with every time printed as 0.00: nccl-tests' two time columns, OSU's and IMB's latencies."""
    import re

    out = []
    for line in text.splitlines():
        prefix, body = re.match(r"(\[\d+,\d+\]<stdout>:)?(.*)", line).groups()  # mpirun --tag-output
        p = body.split()
        if len(p) >= 12 and p[0].isdigit() and p[2] in ("float", "half", "bfloat16", "double"):
            times = [i for i, x in enumerate(p) if re.fullmatch(r"\d+\.\d+", x)]
            for i in times[:1] + times[3:4]:
                p[i] = "0.00"
            line = (prefix or "") + "  ".join(p)
        elif re.fullmatch(r"\s*\d+(,\d+)?\s+[\d.]+\s*", line):
            line = re.sub(r"[\d.]+\s*$", "0.00", line)
        out.append(line)
    return "\n".join(out) + "\n"


def fam_net_logs(rng, d):
    """nccl-tests and OSU logs whose times are all 0.00 (below the log's resolution), and importer options naming
    a backend or transport no trace may hold."""
    logs = [p for p in corpus()["logs"] if "allreduce" in p.name or p.suffix == ".nccl" or "nccl_" in p.name]
    if not logs:
        return fam_net_trace(rng, d)
    src = rng.choice(logs)
    kind = "osu" if "allreduce" in src.name else "nccl-tests"
    text = src.read_text(errors="replace")
    name = src.name  # the OSU importer reads the rank count from it (allreduce4.log)
    if rng.random() < 0.5:
        _write(d, name, _zero_log_times(text))
        return Case("net_logs", ["import", kind, name, "-o", "o.json"], (name,))
    _write(d, name, text)
    key = "transport" if kind == "nccl-tests" else rng.choice(["transport", "backend"])
    value = rng.choice(["bogus", "ncl", "Ethernet", "carrier pigeon", "NCCL"])
    return Case("net_logs", ["import", kind, name, "-s", f"{key}={value}", "-o", "o.json"], (key,))


def _quiet_main(d: Path, argv: list[str]) -> int:
    from simfog import cli

    cwd = os.getcwd()
    try:
        os.chdir(d)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return cli.main(argv)
    finally:
        os.chdir(cwd)


def fam_sweep_resume(rng, d):
    """A sweep CSV whose last row a kill cut short (between its "\r" and "\n" included): the resumed sweep exits 0
    and the CSV is byte for byte the uncut one (the torn point recomputed, none lost or doubled)."""
    _good_trace(d, rng)
    e = {"seed": rng.randrange(100), "iterations": 2, "workload": {"trace": "t.json", "compute": rng.choice(
        ["mean", "samples"])}, "cluster": {"nodes": 2, "gpus_per_node": 2, "nic_bandwidth": "25Gbit/s"}}
    name = _write(d, "e.toml", dump_toml(e))
    argv = ["sweep", name, "--ranks", rng.choice(["1,2,4", "2,4", "1,4,2"]), "--merge", rng.choice(["ddp", "ddp,wfbp"]),
            "--jobs", "1", "--no-progress", "-o", "s.csv"]
    if _quiet_main(d, argv) != 0:
        raise RuntimeError(f"the uncut sweep failed: simfog {' '.join(argv)}")
    whole = (d / "s.csv").read_bytes()
    last = whole.rstrip(b"\r\n").rfind(b"\n") + 1   # where the last row starts
    cut = rng.choice([len(whole) - 1, len(whole) - 2, rng.randrange(last, len(whole)), last])
    (d / "s.csv").write_bytes(whole[:cut])

    def verify(folder: Path) -> str | None:
        got = (folder / "s.csv").read_bytes()
        return None if got == whole else f"cut at {cut} of {len(whole)} bytes: resumed CSV differs ({len(got)} bytes)"

    return Case("sweep_resume", argv, ("s.csv",), may_succeed=True, verify=verify)


# ---- agents' requests (validate/launch/shared_dir.py) ----
_AGENT_SECRET = bytes(range(32))
_AGENT_NONCE = "0123456789abcdef0123456789abcdef"
# (field, values a validator never sends): each must be refused whatever the rest of the request says.
AGENT_BREAKS = [
    ("module", ["evilmod", "os", "validate.collect.collect_model", "validate.ranks.worker ", "", 5, None]),
    ("env", [{"PYTHONPATH": "/shared"}, {"LD_PRELOAD": "/shared/x.so"}, {"LD_LIBRARY_PATH": "/tmp"},
             {"OMP_NUM_THREADS": "0"}, {"OMP_NUM_THREADS": "1; rm -rf /"}, {"OMP_NUM_THREADS": 4}, [], "x"]),
    ("run", ["../../outside", "/etc", "a/b", "", ".hidden", "x" * 65, 5, None]),
    ("nodes", [5, [], [0, 0], [1, 0], [99], ["0"], [True], [-1], None]),
    ("nproc_per_node", [0, -1, 10**9, "2", 1.5, True, None]),
    ("k", [-1, 2**70, 1.5, "0", None]),
    ("args", [["/etc/passwd", "out"], ["../spec.json", "out"], ["spec.json"], ["spec.json", "out", "--evil"],
              ["spec.json", "out", "--timeout", "inf"], ["spec.json", "out", "--timeout"], ["spec.txt", "out"],
              ["spec.json", "out", "--backend", "mpi"], [5, 6], "spec.json out", None]),
    ("agents", [[], ["zz" * 16], [_AGENT_NONCE, _AGENT_NONCE], [5], "x"]),
]


def _agent_request() -> dict:
    return {"run": "run-1", "k": 0, "nodes": [0], "nproc_per_node": 2, "module": "validate.ranks.worker",
            "args": ["launches/run-1/spec.json", "launches/run-1/out", "--timeout", "120"],
            "env": {"OMP_NUM_THREADS": "1"}, "agents": [_AGENT_NONCE]}


def _agent_check(raw) -> None:
    """What a node agent does with a request file's bytes: check its signature, then every field."""
    from validate.launch.agent_request import parse_request, unseal

    parse_request(unseal(raw, "launch", _AGENT_SECRET), 1)


def fam_agent_requests(rng, d):
    """A node agent's launch request as an attacker or a torn write leaves it: a module, argument, environment,
    run folder or field the validator never sends (signed with the real secret: what a holder of the secret
    cannot do either), or a message not signed with the secret (unsigned, forged, another secret, another kind,
    truncated, not JSON). Each must be refused with a ConfigError naming the field."""
    from validate.launch.agent_request import seal

    body = _agent_request()
    how = rng.random()
    if how < 0.6:
        field, values = rng.choice(AGENT_BREAKS)
        body[field] = rng.choice(values)
        raw, names = seal("launch", body, _AGENT_SECRET), (field,)
    elif how < 0.7:
        body[rng.choice(["extra", "PYTHONPATH"])] = "x"
        if rng.random() < 0.5:
            del body[rng.choice(sorted(set(body) - {"extra", "PYTHONPATH"}))]
        raw, names = seal("launch", body, _AGENT_SECRET), ("request",)
    else:
        sealed = seal("launch", body, _AGENT_SECRET)
        raw, names = rng.choice([
            (json.dumps(body).encode(), ("message",)),                                   # unsigned
            (sealed.replace(sealed[-20:-4], b"0" * 16), ("mac", "message")),              # forged signature
            (seal("launch", body, bytes(32)), ("mac",)),                                 # another secret
            (seal("report", body, _AGENT_SECRET), ("kind",)),                            # another kind
            (sealed[: rng.randrange(1, len(sealed))], ("content", "mac", "body")),  # torn write
            (b"\xff\xfe" + sealed, ("content",)), (b"[" * 10_000, ("content",)),
            (sealed.replace(b'"k": 0', b'"k": NaN'), ("body", "mac", "content"))])
    return Case("agent_requests", [f"agent request {raw[:60]!r}"], names, call=lambda: _agent_check(raw))



# ---- the surfaces of issue 35: fabric shapes at their bounds, output paths that cannot be made, the jobs API,
# retarget's written traces, count lists, calibrate flags that contradict each other ----

def _small_exp(d: Path, rng: random.Random, nodes: int = 8, gpus: int = 2, **tables) -> str:
    """A fast experiment on `nodes` x `gpus` (the shipped trace's mean layer times, 2 iterations) with `tables`."""
    _good_trace(d, rng)
    e = {"seed": rng.randrange(100), "iterations": 2, "workload": {"trace": "t.json", "compute": "mean"},
         "cluster": {"nodes": nodes, "gpus_per_node": gpus, "nic_bandwidth": "25Gbit/s"}, **tables}
    return _write(d, "e.toml", dump_toml(e))


# A valid [fabric] table of each kind for 8 nodes (one NIC each): the breakers below make it invalid.
FABRIC_BASES = [
    {"kind": "fat_tree", "nodes_per_leaf": 2},
    {"kind": "fat_tree", "tiers": 3, "nodes_per_leaf": 2, "leaves_per_pod": 2},
    {"kind": "fat_tree", "tiers": 3, "nodes_per_leaf": 2, "leaves_per_pod": 2, "leaf_uplinks": 4},
    {"kind": "rail", "nodes_per_group": 4},
    {"kind": "dragonfly", "routers_per_group": 2, "nodes_per_router": 2, "local_bandwidth": "100Gbit/s",
     "global_bandwidth": "100Gbit/s"},
    {"kind": "flat"},
]
_COUNTS = [0, -1, 1.5, "2", True, BIG, 10**12, 2**22 + 1]
_RATES = ["0Gbit/s", "-1Gbit/s", "x", 5, "1e400Gbit/s", "", "Gbit/s", "1e-300B/s"]
_OVERS = [0, -1, NAN, INF, "2", True, BIG, 1e300, 1e-300]
# key -> bad values, by kind (each is wrong whatever else the table says)
FABRIC_BREAKS = {
    "fat_tree": {"nodes_per_leaf": _COUNTS, "leaves": _COUNTS + [1, 3], "leaf_uplinks": _COUNTS,
                 "leaf_uplink_bandwidth": _RATES, "leaf_oversubscription": _OVERS, "tiers": [1, 4, "3", 2.5],
                 "leaves_per_pod": _COUNTS, "pods": _COUNTS + [1], "spine_uplinks": _COUNTS,
                 "spine_uplink_bandwidth": _RATES, "spine_oversubscription": _OVERS},
    "rail": {"nodes_per_group": _COUNTS, "groups": _COUNTS + [1], "rail_uplinks": _COUNTS[1:],
             "rail_uplink_bandwidth": _RATES, "oversubscription": _OVERS, "rail_only": ["yes", 1]},
    "dragonfly": {"routers_per_group": _COUNTS, "nodes_per_router": _COUNTS, "groups": _COUNTS + [1],
                  "local_bandwidth": _RATES + [DELETE], "global_bandwidth": _RATES,
                  "global_links_per_pair": _COUNTS + [65], "routing": ["adaptive", 1]},
    "flat": {"oversubscription": _OVERS + [0.5, 1e-300]},
}


def fam_fabric(rng, d):
    """A [fabric] table at and beyond its bounds: spines_per_pod over the leaves' uplinks (5, 100, 10**12 on a
    three-tier fat tree whose leaves have 2 or 4), counts of 0 or past 4M nodes, rates and oversubscriptions of 0,
    NaN or 1e400, keys of another kind or tier, a fabric smaller than the cluster. Each must be refused naming
    the file."""
    table = _copy(rng.choice(FABRIC_BASES))
    kind = table["kind"]
    pick = rng.random()
    if pick < 0.25 and table.get("tiers") == 3:
        uplinks = table.get("leaf_uplinks", table["nodes_per_leaf"])
        table["spines_per_pod"] = uplinks + rng.choice([1, 3, 98, 10**12])
    elif pick < 0.35:
        key, value = rng.choice([("kind", "torus"), ("kind", 5), ("ecmp", "random"), ("switch_latency", "-1us"),
                                 ("switch_latency", "2s"), ("switch_latency", 5), ("bogus", 1)])
        table[key] = value
    elif pick < 0.45 and kind in ("fat_tree", "rail", "dragonfly"):
        other = {"fat_tree": ("groups", 2), "rail": ("leaves", 2), "dragonfly": ("nodes_per_leaf", 2)}[kind]
        table[other[0]] = other[1]  # a key of another kind
    elif pick < 0.5 and kind == "fat_tree":
        if table.get("tiers") == 3:
            table["leaves"] = 4
        else:
            table[rng.choice(["leaves_per_pod", "pods", "spines_per_pod", "spine_uplinks"])] = 2
    else:
        key, values = rng.choice(list(FABRIC_BREAKS[kind].items()))
        if key.startswith("spine") and table.get("tiers") != 3:
            table["tiers"], table["leaves_per_pod"] = 3, 2
        _set(table, (key,), rng.choice(values))
    name = _small_exp(d, rng, fabric=table)
    return Case("fabric", ["simulate", name], (name,))


_LONG = "x" * 300                   # a name over NAME_MAX (255 bytes)
_TEMP_LONG = "y" * 240              # under NAME_MAX, but its temporary file's name is not
UNWRITABLE = ["/proc/nonexistent/o", "/proc/o", "/sys/o", "/sys/kernel/o", "/proc/self/o", "/dev/null/o",
              _LONG, _TEMP_LONG, f"{_LONG}/o", "d/" * 2100 + "o", ""]


def fam_output_paths(rng, d):
    """Every command's output (and simfog.sweep's) named where no file can be made: under /proc or /sys (no
    such folder, or a file system that refuses), over 255 bytes (or so near that the write's temporary file
    would be), a path over 4 KiB, or empty. Each must be refused before any work, naming the option."""
    e = _small_exp(d, rng, nodes=2)
    where = rng.choice(UNWRITABLE)
    net = str(ROOT / "traces" / "net-gloo-loopback.json.gz")

    def file(suffix):  # a file name: the path with its suffix (an empty one stays empty)
        return where + suffix if where else ""

    stem = _LONG if where == _TEMP_LONG else where  # a folder (curve, tune, plan): 240 bytes is a good name

    cases = [
        (["simulate", e, "--intervals", file(".csv")], "--intervals"),
        (["simulate", e, "--timeline", file(".json")], "--timeline"),
        (["sweep", e, "--jobs", "1", "--no-progress", "-o", file(".csv")], "-o"),
        (["curve", e, "--ranks", "2,4", "--jobs", "1", "--no-progress", "-o", stem], "-o"),
        (["tune", e, "--points", "3", "--refine", "1", "-o", stem], "-o"),
        (["plan", "t.json", "--target-samples-per-s", "1", "-o", stem], "-o"),
        (["retarget", "t.json", "--device", "a100", "-o", file(".json")], "-o"),
        (["import", "osu", "x.log", "-o", file(".json")], "--output"),
        (["calibrate", net, "--model", "nccl", "-o", file(".toml")], "-o"),
    ]
    argv, option = rng.choice(cases)
    if argv[0] == "import":
        (d / "x.log").write_text("# OSU MPI Allreduce Latency Test\n# Size       Avg Latency(us)\n4 1.0\n8 2.0\n")
    if rng.random() < 0.15:  # the Python API's sweep takes the same check
        out = file(".csv")
        return Case("output_paths", [f"simfog.sweep(output={out[:40]!r}...)"], ("output",),
                    call=lambda: __import__("simfog").sweep(d / e, ranks=[2], output=out))
    return Case("output_paths", argv, (option, "output", "--output", "-o"))


def _jobs_file(d: Path, rng: random.Random) -> Path:
    _good_trace(d, rng)
    text = ('seed = 1\niterations = 2\n[cluster]\nnodes = 4\ngpus_per_node = 1\nnic_bandwidth = "25Gbit/s"\n'
            '[[job]]\nname = "a"\nworkload = { trace = "t.json", compute = "mean" }\nranks = 2\n'
            '[[job]]\nname = "b"\nworkload = { trace = "t.json", compute = "mean" }\nranks = 2\n')
    return d / _write(d, "jobs.toml", text)


def fam_jobs_api(rng, d):
    """simfog.jobs.load / from_table / run and Experiment.with_comm with what no jobs file can say: arguments of
    the wrong type, a job twice (the same nodes), jobs of two loads of one file (same names, same nodes), more
    than MOST_JOBS, a Comm field that does not exist. Each must raise simfog.ConfigError, before simulating."""
    import simfog
    from simfog import jobs
    from simfog.experiment import KEY_OF_FIELD

    path = _jobs_file(d, rng)
    how = rng.randrange(5)
    if how == 0:
        arg = rng.choice([None, 5, b"jobs.toml", 1.5, ["jobs.toml"], "", "nope.toml", str(d)])
        return Case("jobs_api", [f"simfog.jobs.load({arg!r})"], ("path",), call=lambda: jobs.load(arg))
    if how == 1:
        arg = rng.choice([5, None, [], "x", 1.5, {"job": 5}, {"cluster": 5, "job": [{}]}, {"job": [{}] * 9}])
        return Case("jobs_api", [f"simfog.jobs.from_table({str(arg)[:40]})"], ("d", "job", "cluster"),
                    call=lambda: jobs.from_table(arg, base_dir=d))
    if how == 2:
        loaded = jobs.load(path)
        arg = rng.choice([None, 5, ["x"], [simfog.load(d / _small_exp(d, rng, nodes=2))], [], "ab", {"a": 1},
                          [loaded[0], loaded[0]], loaded + jobs.load(path), loaded * 5, [loaded[0], None]])
        model = rng.choice(["expectation", "timeline"])
        shown = str(arg)[:60]
        return Case("jobs_api", [f"simfog.jobs.run({shown}, model={model!r})"], ("jobs", "job"),
                    call=lambda: jobs.run(arg, model=model))
    if how == 3:
        loaded = jobs.load(path)
        arg = rng.choice(["fast", None, 5, ["timeline"]])
        return Case("jobs_api", [f"simfog.jobs.run(jobs, model={arg!r})"], ("model",),
                    call=lambda: jobs.run(loaded, model=arg))
    exp = simfog.load(d / _small_exp(d, rng, nodes=2))
    key, value = rng.choice([("bogus", 1), ("threshold", "25MiB"), ("streams", "x"), ("merge", 5),
                             ("threshold_bytes", NAN), ("collective", None), ("algorithm", []), ("", 1)])
    names = (key, "comm." + KEY_OF_FIELD.get(key, key))  # Comm names a bad value as the file's [comm] key
    return Case("jobs_api", [f"Experiment.with_comm({key}={value!r})"], names,
                call=lambda: exp.with_comm(**{key: value}))


def fam_retarget_outputs(rng, d):
    """`simfog retarget` at the edges of what its options accept (--samples-per-s 1e-300 to 1e300, --efficiency
    1e-300 to 1, --launch up to 0.99 s): exit 0 must write a trace simfog loads back, else a clean error and
    nothing written."""
    _good_trace(d, rng)
    argv = ["retarget", "t.json", "--device", rng.choice(["a100", "h100", "v100"])]
    for flag, values in (("--samples-per-s", ["1e-300", "1e-12", "1e-6", "1e300", "1e12", "3e11", "1", "1e9"]),
                         ("--efficiency", ["1e-300", "1e-20", "1e-9", "1e-3", "1", "5e-324"]),
                         ("--launch", ["0us", "0.99s", "1e-300s", "500ms"])):
        if rng.random() < 0.6:
            argv += [flag, rng.choice(values)]
    out = rng.choice(["r.json", "r.json.gz"])
    return Case("retarget_outputs", argv + ["-o", out], ("--samples-per-s", "--efficiency", "--launch", out,
                                                          "efficiency"), may_succeed=True, output=out)


def fam_count_lists(rng, d):
    """Comma-separated counts and names typed wrong: an empty item, spaces, a sign or underscore (`4,,8`,
    `' 4'`, `4,`, `+4`, `4_0`): plan --gpus / --nodes, sweep and curve --ranks, sweep --merge / --collective."""
    e = _small_exp(d, rng, nodes=2)
    text = rng.choice(["4,,8", " 4", "4 ", "4,", ",4", "4, 8", ",", "+4", "4_0", "4,8,", "\t4", "4,,", "٤"])
    flag = rng.choice(["--gpus", "--nodes", "sweep --ranks", "curve --ranks", "--merge", "--collective"])
    if flag in ("--gpus", "--nodes"):
        argv = ["plan", e, flag, text]
    elif flag == "curve --ranks":
        argv = ["curve", e, "--ranks", text, "--jobs", "1", "--no-progress"]
    else:
        value = text.replace("4", "ddp" if flag == "--merge" else "ring") if flag != "sweep --ranks" else text
        argv = ["sweep", e, "--jobs", "1", "--no-progress", flag.split()[-1], value]
    return Case("count_lists", argv, (flag.split()[-1],))


def fam_calibrate_flags(rng, d):
    """calibrate --nvls with what rules NVLink SHARP out (--gpu-arch volta or ampere, --intra-transport pci or
    nvlink): exit 0 only with a warning that names nvls; or a bad flag value, refused."""
    net = str(ROOT / "traces" / "net-gloo-loopback.json.gz")
    argv = ["calibrate", net, "--model", "nccl", "--nvls"]
    if rng.random() < 0.8:
        argv += rng.choice([["--gpu-arch", rng.choice(["volta", "ampere"])],
                            ["--gpu-arch", "hopper", "--intra-transport", rng.choice(["pci", "nvlink"])],
                            ["--intra-transport", "pci"]])
        return Case("calibrate_flags", argv, ("nvls",), may_succeed=True, warns="nvls")
    argv += rng.choice([["--gpu-arch", "pascal"], ["--intra-transport", "carrier"], ["--nvls-x"]])
    return Case("calibrate_flags", argv, ("--gpu-arch", "--intra-transport", "--nvls-x"))

FAMILIES = {
    "model_trace": fam_model_trace, "trace_bytes": fam_trace_bytes, "net_trace": fam_net_trace,
    "experiment": fam_experiment, "experiment_text": fam_experiment_text, "special_files": fam_special_files,
    "options": fam_options, "outputs": fam_outputs, "catalogue": fam_catalogue, "ref_logs": fam_ref_logs,
    "kineto": fam_kineto, "units_overflow": fam_units_overflow,
    "api": fam_api, "network_file": fam_network_file, "sharded": fam_sharded, "net_logs": fam_net_logs,
    "sweep_resume": fam_sweep_resume, "agent_requests": fam_agent_requests,
    "fabric": fam_fabric, "output_paths": fam_output_paths, "jobs_api": fam_jobs_api,
    "retarget_outputs": fam_retarget_outputs, "count_lists": fam_count_lists, "calibrate_flags": fam_calibrate_flags,
}


# ---- running one case ----

class Hang(BaseException):
    """Raised by the alarm: BaseException so that no `except Exception` in simfog swallows it."""


def _tree(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


def run_case(case: Case, d: Path, timeout: float | None = 30) -> Outcome:
    """Run case.argv in folder `d` through simfog.cli.main (or case.call, a Python API call); classify the
    outcome."""
    from simfog import cli
    from simfog.errors import ConfigError

    before = _tree(d)
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    old = signal.signal(signal.SIGALRM, _alarm) if timeout else None
    rc: object = None
    raised: ConfigError | None = None
    try:
        os.chdir(d)
        if timeout:
            signal.setitimer(signal.ITIMER_REAL, timeout)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                if case.call is not None:
                    case.call()
                    rc = 0
                else:
                    rc = cli.main(list(case.argv))
            except SystemExit as e:
                rc = e.code
            except ConfigError as e:
                if case.call is None:
                    raise
                raised, rc = e, 2
    except Hang:
        return Outcome("hang", None, err.getvalue())
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return Outcome("traceback", None, err.getvalue(),
                       f"{type(e).__name__}: {str(e)[:160]} at {Path(tb.filename).name}:{tb.lineno}")
    finally:
        if timeout:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        os.chdir(cwd)
    stderr = err.getvalue() if raised is None else f"simfog: error: {raised}\n"
    lines = stderr.splitlines()
    written = _tree(d) - before
    if rc == 0 and case.may_succeed:
        return _succeeded(case, d, rc, stderr)
    if rc != 2 or len(lines) != 1 or ": error: " not in lines[0] or "Traceback" in stderr:
        return Outcome("silent", rc, stderr, f"exit {rc}, {len(lines)} stderr line(s)")
    if written:
        return Outcome("silent", rc, stderr, f"wrote {sorted(written)}")
    named = (raised.field in case.names or raised.field.split("[")[0].split(".")[0] in case.names  # args[0]: args
             ) if raised is not None else any(n in lines[0] for n in case.names)
    if case.names and not named:
        return Outcome("vague", rc, stderr, f"does not name {' or '.join(case.names)}")
    return Outcome("clean", rc, stderr)


def _succeeded(case: Case, d: Path, rc: object, stderr: str) -> Outcome:
    """Exit 0 where the case allows it: `verify` finds nothing wrong, or `output` loads as a trace, or stderr
    warns of `warns`."""
    if case.warns is not None:
        warned = any(line.startswith("simfog: warning:") and case.warns in line for line in stderr.splitlines())
        return Outcome("ok", rc, stderr) if warned else Outcome("silent", rc, stderr, f"exit 0 without a warning "
                                                                                       f"naming {case.warns}")
    if case.verify is not None:
        wrong = case.verify(d)
        return Outcome("silent", rc, stderr, f"exit 0 but {wrong}") if wrong else Outcome("ok", rc, stderr)
    from simfog.trace import load_model_trace

    try:
        load_model_trace(d / case.output)
    except Exception as e:  # noqa: BLE001 - any failure to load back is the finding
        return Outcome("silent", rc, stderr, f"exit 0 but {case.output} does not load: {e}")
    return Outcome("ok", rc, stderr)


def _alarm(signum, frame):
    raise Hang()


def make_case(family: str, seed: int, d: Path) -> Case:
    builder = FAMILIES[family]
    return builder(random.Random(f"{family}:{seed}"), d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=200 * len(FAMILIES),
                        help="inputs to try (spread evenly over the families; default 200 each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30, help="seconds per input before it counts as a hang")
    parser.add_argument("--show", type=int, default=10, help="findings printed in full")
    parser.add_argument("--families", default=None, help="comma-separated families to try (default: all)")
    args = parser.parse_args()
    import warnings

    warnings.simplefilter("default")  # every warning shows, as for a fresh `simfog` process
    families = args.families.split(",") if args.families else list(FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"--families: unknown {', '.join(unknown)}; one of {', '.join(FAMILIES)}")
    counts: Counter = Counter()
    by_family: dict[str, Counter] = {f: Counter() for f in families}
    findings: list[tuple] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="simfog-fuzz-") as base:
        for i in range(args.n):
            family = families[i % len(families)]
            d = Path(base) / str(i)
            d.mkdir()
            case = make_case(family, args.seed * 1_000_003 + i, d)
            outcome = run_case(case, d, args.timeout)
            counts[outcome.kind] += 1
            by_family[family][outcome.kind] += 1
            if outcome.kind not in ("clean", "ok"):
                findings.append((family, case.argv, outcome))
    print(f"{args.n} inputs in {time.perf_counter() - started:.0f} s, seed {args.seed}")
    for f in families:
        print(f"  {f:<16} " + ", ".join(f"{k} {v}" for k, v in sorted(by_family[f].items())))
    distinct = Counter((o.kind, o.detail.split(" at ")[-1] if o.kind == "traceback" else o.detail[:60])
                       for _, _, o in findings)
    print(f"clean errors {counts['clean']}, accepted (allowed) {counts['ok']}, vague {counts['vague']}, "
          f"distinct findings {len(distinct)}")
    for family, argv, o in findings[:args.show]:
        print(f"  [{o.kind}] {family}: simfog {' '.join(argv)[:150]}\n      {o.detail} | {o.stderr.strip()[-300:]!r}")
    print(f"tried={args.n} tracebacks={counts['traceback']} silent={counts['silent']} hangs={counts['hang']}")


if __name__ == "__main__":
    main()
