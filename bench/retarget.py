"""How well simfog's per-layer model of compute (simfog.gpu) predicts GPUs it never saw.

1. Kernels, leave one GPU out: for every GPU of the public kernel measurements (bench/data/kernels: NeuSight,
   DeepBench, Vidur, KernelBench), the model is learned from every other GPU's rows (simfog.gpu.fit: the constants
   from at most CAP rows per source, GPU, precision and pass, the shape corrections from at most ALL_ROWS; the search
   starts from simfog.gpu.fit's defaults, not from the fit on every GPU, which has seen the held-out one) and
   predicts that GPU's rows (at most ALL_ROWS per group): median and 90th-percentile |error| per kind, precision
   and GPU.
2. The host: the machine's dispatch cost per operator (simfog.gpu.host) is learned per machine from public whole
   passes (KernelBench's forward passes, pytorch-gpu-benchmark's training and inference iterations), each with the
   kernel model that never saw its GPU; simfog ships the median over KernelBench's machines (recent software) times
   the median training / inference ratio of pytorch-gpu-benchmark's machines (the rule was set before any H200
   figure was seen; its first implementation took the ratio of the two sources' machines instead, a bug).
3. Whole steps held out: pytorch-gpu-benchmark's training iterations (ResNet-50, VGG-16, DenseNet-121; batch 12;
   FP32/TF32 and FP16) predicted with the kernel model without their GPU and the host learned without their
   machine: the |ln(measured / predicted)| scores a retargeted trace's compute interval is conformal on
   (simfog.run_bands, --write).
4. The seven zoo models measured on an H200 (traces/h200/, never used in learning): each CPU trace retargeted to the
   H200 (simfog retarget's model and shipped host figures) against both runs: per-layer medians and the whole step;
   and the 90 % interval's coverage of those steps.
5. The A100 ResNet-50 DDP Kineto trace (bench/data/ref/kineto-nccl, HTA's test data, batch 32 read off its first
   ReLU's grid): its compute kernels per step by kind against the model's device times (without the A100).
6. NeuSight's own whole-step training labels (GPT-2 large, GPT-3 XL and 2.7B, OPT-1.3B, BERT-large; FP32; H100,
   A100-80GB, L4 and its training GPUs), the models' operators built from their configurations, each GPU with the
   model that never saw it.

Last line: `gpus=<n> ops=<n> op_median=<pct> op_p90=<pct> step_median=<pct> step_worst=<pct> coverage90=<pct>`
(ops and op errors from 1; step errors and coverage from the H200 runs of 4).

Run: python bench/retarget.py [--cap N] [--cache DIR] [--write]  (needs torch for the zoo's operators; 6 minutes on
this project's idle 2-core machine, 10 s from a full `--cache`, which keeps the fits between runs keyed by the code
and data they come from, SOURCES and bench/data). --write writes simfog/data/gpu_model.json;
bench/compute_estimates.py --write the compute interval's scores (simfog/data/compute_estimates.toml) from 3.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
import pickle
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import retarget_data as data  # noqa: E402

from simfog.bands import conformal_quantile  # noqa: E402
from simfog.gpu import fit as F  # noqa: E402
from simfog.gpu import host as H  # noqa: E402
from simfog.gpu.model import GpuModel, kernel_times  # noqa: E402
from simfog.gpu.specs import DEVICES  # noqa: E402

ROOT = data.ROOT
TEMPLATE = {"host.forward_op_s": 1.0, "host.backward_op_s": 1.0, "host.optimizer_op_s": 3.0, "host.launch_s": 0.25}
CAP = 150  # rows per (source, GPU, precision, pass or kind) the constants are learned from
ALL_ROWS = 1500  # rows per group the shape corrections are learned from and every GPU is judged on
# The GPUs whose held-out results model changes were chosen on (fixed before any change was tried); the others'
# figures (printed apart) judge those choices honestly.
DEV_GPUS = ("p100", "t4", "a100-pcie", "l4", "titan-xp", "a40")


# What the cached values are computed from: a --cache kept across a change to any of these recomputes
# (a stale fit, silently reused, once moved the bench's figures).
SOURCES = ("simfog/gpu/*.py", "bench/retarget.py", "bench/retarget_data.py", "validate/collect/*.py")


@functools.cache
def code_version() -> str:
    """A digest of SOURCES' contents and of bench/data (its committed tree and any local change to it)."""
    digest = hashlib.sha256()
    for pattern in SOURCES:
        for path in sorted(ROOT.glob(pattern)):
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    for args in (["rev-parse", "HEAD:bench/data"], ["status", "--porcelain", "--", "bench/data"]):
        digest.update(subprocess.run(["git", *args], capture_output=True, cwd=ROOT).stdout)
    return digest.hexdigest()[:16]


def cached(cache: Path | None, key: str, make):
    """`make()`, kept in `cache` under `key` and the code version (None: no cache)."""
    if cache is None:
        return make()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / (hashlib.sha256(f"{code_version()}|{key}".encode()).hexdigest()[:16] + ".pkl")
    if path.exists():
        return pickle.loads(path.read_bytes())
    value = make()
    path.write_bytes(pickle.dumps(value))
    return value


def model_of(fitted: F.Fitted, host: dict | None = None) -> GpuModel:
    return GpuModel(fitted.params, fitted.corrections, host or {k: v * 1e-5 for k, v in TEMPLATE.items()})


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def errors(pred, meas) -> np.ndarray:
    return np.expm1(np.abs(np.log(np.asarray(pred, float) / np.asarray(meas, float))))


# ---- 1. kernels, leave one GPU out ----

def leave_one_gpu_out(tables, cache, cap, rows_all=None, only=None) -> tuple[dict, list]:
    """({gpu: fit without it}, rows (family, kind, precision, gpu, source, error)) over every GPU of `tables` (or
    those of `only`): the constants learned from `tables`, the shape corrections from `rows_all` (more rows of the
    same sources; default `tables`), the held-out GPU's rows of `rows_all` predicted."""
    rows_all = rows_all or tables
    gpus = sorted(g for g in {g for t in tables.values() for g in t["gpu"]} if only is None or g in only)
    fits, rows = {}, []
    for gpu in gpus:
        train = {fam: F.select(t, np.array(t["gpu"]) != gpu) for fam, t in tables.items()}
        more = {fam: F.select(t, np.array(t["gpu"]) != gpu) for fam, t in rows_all.items()}
        fits[gpu] = cached(cache, f"logo4|{gpu}|{cap}", lambda train=train, more=more: F.fit(
            train, max_evaluations=40, corrections_from=more))
        assert not any(gpu in t["gpu"] for t in [*train.values(), *more.values()])  # never learned from
        for fam, t in rows_all.items():
            test = F.select(t, np.array(t["gpu"]) == gpu)
            if not test["gpu"]:
                continue
            err = errors(F.predict(fits[gpu], fam, test), [float(x) for x in test["time_s"]])
            kinds = test.get("pass") if fam == "conv" else test.get("kind") if fam == "memory" else \
                ["bmm" if int(b) > 1 else "linear" for b in test["batch"]]
            rows += [(fam, k, p, gpu, s, e) for k, p, s, e in zip(kinds, test["precision"], test["source"], err,
                                                                  strict=True)]
        print(f"  held out {gpu}: {sum(1 for r in rows if r[3] == gpu)} ops, median "
              f"{pct(np.median([r[5] for r in rows if r[3] == gpu]))}", flush=True)
    return fits, rows


def report_ops(rows) -> None:
    print("\n1. kernels, each GPU predicted by the model learned without it: median / p90 |error| (ops)")
    for name, part in (("development GPUs (" + ", ".join(DEV_GPUS) + ")", [r for r in rows if r[3] in DEV_GPUS]),
                       ("the other GPUs", [r for r in rows if r[3] not in DEV_GPUS])):
        if part:
            e = [r[5] for r in part]
            print(f"  {name}: {len(e)} ops, median {pct(np.median(e))}, p90 {pct(np.quantile(e, 0.9))}")
    by: dict[tuple, list] = {}
    for fam, kind, prec, gpu, _, e in rows:
        by.setdefault((fam, kind, prec), []).append((e, gpu in DEV_GPUS))
    print(f"{'family':7s} {'kind':12s} {'prec':5s} {'ops':>6s} {'median':>8s} {'p90':>8s}   development: "
          f"{'ops':>5s} {'median':>8s} {'p90':>8s}   other: {'ops':>5s} {'median':>8s} {'p90':>8s}")

    def cols(e) -> str:
        return f"{len(e):5d} {pct(np.median(e)):>8s} {pct(np.quantile(e, 0.9)):>8s}" if e else f"{0:5d} {'':17s}"

    for key in sorted(by):
        e = [x for x, _ in by[key]]
        print(f"{key[0]:7s} {key[1]:12s} {key[2]:5s} {len(e):6d} {pct(np.median(e)):>8s} "
              f"{pct(np.quantile(e, 0.9)):>8s}                {cols([x for x, d in by[key] if d])}          "
              f"{cols([x for x, d in by[key] if not d])}")
    print("per GPU:")
    gpus = sorted({r[3] for r in rows})
    for gpu in gpus:
        e = [r[5] for r in rows if r[3] == gpu]
        print(f"  {gpu:16s} {len(e):6d} ops  median {pct(np.median(e)):>7s}  p90 {pct(np.quantile(e, 0.9)):>7s}"
              f"{'  (development)' if gpu in DEV_GPUS else ''}")


# ---- 2. the host ----

def host_scale(launches, seconds, measured_s, extra_s=0.0) -> float:
    """The scale s of TEMPLATE (in seconds per unit) at which the timeline of `launches` (kernel `seconds`) plus
    `extra_s` takes `measured_s`; 0 when the device alone takes longer."""
    def step(s):
        added, _ = H.timeline(seconds, H.issue_gaps(launches, {k: v * s for k, v in TEMPLATE.items()}))
        return added.sum() + extra_s

    if step(0.0) >= measured_s:
        return 0.0
    lo, hi = 0.0, 1e-3
    while step(hi) < measured_s and hi < 1.0:
        hi *= 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(mid) < measured_s else (lo, mid)
    return (lo + hi) / 2


def machine_scales(fits, everything, cache) -> dict:
    """Per machine: the host scale of each measured pass (KernelBench forward passes per machine folder,
    pytorch-gpu-benchmark training and inference iterations per GPU), with the kernel model without its GPU."""
    problems, rows = data.kernelbench_forwards()
    out: dict[str, list] = {}
    for r in rows:
        gpu = DEVICES.get(r["gpu"])
        fitted = fits.get(gpu.name)
        if fitted is None or r["time_s"] <= 0:
            continue
        launches = data.forward_program(problems[r["model"]], "torch", gpu)
        if len(launches) < 8:  # too few launches to tell the host from the device
            continue
        seconds, _, _ = kernel_times(model_of(fitted), launches, gpu)
        out.setdefault(f"kernelbench:{r['note']}", []).append(host_scale(launches, seconds, r["time_s"]))
    for r in data.public_steps():
        gpu = DEVICES.get(r["gpu"])
        fitted = fits.get(gpu.name, everything)  # a GPU with no kernel rows: the fit on every GPU never saw it
        launches, copy_s = cached(cache, f"zoo|{r['model']}|{r['batch']}|{r['precision']}|{gpu.name}",
                                  lambda r=r, gpu=gpu: data.zoo_program(r["model"], r["batch"], r["precision"], gpu))
        seconds, _, _ = kernel_times(model_of(fitted), launches, gpu)
        out.setdefault(machine(r), []).append(host_scale(launches, seconds, r["time_s"], copy_s))
    for r in data.public_steps("inference"):
        gpu = DEVICES.get(r["gpu"])
        launches, copy_s = cached(cache, f"zoo-inference|{r['model']}|{r['batch']}|{r['precision']}|{gpu.name}",
                                  lambda r=r, gpu=gpu: data.zoo_program(r["model"], r["batch"], r["precision"], gpu,
                                                                        loop="inference"))
        seconds, _, _ = kernel_times(model_of(fits.get(gpu.name, everything)), launches, gpu)
        out.setdefault(machine(r) + ":inference", []).append(host_scale(launches, seconds, r["time_s"], copy_s))
    # a pass the device alone takes longer than says nothing of the host (0 is a bound, not an estimate)
    return {k: [x for x in v if x > 0] for k, v in out.items() if any(x > 0 for x in v)}


def machine(r: dict) -> str:
    """A pytorch-gpu-benchmark row's machine: its result folder (2080TI and 2080ti(2) are two setups)."""
    return "pytorch-gpu-benchmark:" + r["note"].split("__")[1]


def default_host(scales: dict, leave_out: str | None = None) -> dict:
    """The shipped host figures (module docstring, 2): the median scale of KernelBench's machines (recent
    software, forward passes), times the median over pytorch-gpu-benchmark's machines of each one's training scale
    over its inference scale (the same machine and software: what autograd's recording and backward add per
    operator); `leave_out` a machine (its training and inference both)."""
    kb = [np.median(v) for k, v in scales.items() if k.startswith("kernelbench:") and k != leave_out]
    ratios = [np.median(v) / np.median(scales[k + ":inference"]) for k, v in scales.items()
              if k.startswith("pytorch-gpu-benchmark:") and not k.endswith(":inference") and k != leave_out
              and k + ":inference" in scales]
    scale = float(np.median(kb)) * (float(np.median(ratios)) if ratios else 1.0)
    return {k: v * scale for k, v in TEMPLATE.items()}


# ---- 3. public whole steps, held out ----

def public_step_scores(fits, everything, scales, cache) -> list[tuple[str, float, float]]:
    """(what, predicted, measured) of every pytorch-gpu-benchmark training iteration, each with the kernel model
    without its GPU and the host figures without its machine."""
    out = []
    for r in data.public_steps():
        gpu = DEVICES.get(r["gpu"])
        launches, copy_s = cached(cache, f"zoo|{r['model']}|{r['batch']}|{r['precision']}|{gpu.name}",
                                  lambda r=r, gpu=gpu: data.zoo_program(r["model"], r["batch"], r["precision"], gpu))
        host = default_host(scales, leave_out=machine(r))
        seconds, _, _ = kernel_times(model_of(fits.get(gpu.name, everything)), launches, gpu)
        added, _ = H.timeline(seconds, H.issue_gaps(launches, host))
        out.append((f"{r['model']} {r['precision']} b{r['batch']} on {gpu.name} ({r['note'].split(':')[0]})",
                    float(added.sum() + copy_s), r["time_s"]))
    return out


# ---- 4. the H200 runs ----

def h200(model: GpuModel) -> list[dict]:
    """Per CPU trace and H200 run: predicted and measured step, and per-layer medians."""
    from simfog.retarget import retarget
    from simfog.trace import load_model_trace

    out = []
    for cpu, runs in data.h200_runs():
        est = retarget(load_model_trace(cpu), "h200", model=model)
        e_layers = np.array([layer.forward_s[0] + layer.backward_s[0] for layer in est.layers])
        e_step = float(e_layers.sum() + est.optimizer_s[0])
        for run in runs:
            real = load_model_trace(run)
            m_layers = np.array([np.median(layer.forward_s) + np.median(layer.backward_s) for layer in real.layers])
            m_step = float(np.median(np.array([layer.forward_s for layer in real.layers]).sum(0))
                           + np.median(np.array([layer.backward_s for layer in real.layers]).sum(0))
                           + np.median(real.optimizer_s))
            big = m_layers >= 0.01 * m_layers.sum()
            out.append({"run": run.name, "predicted": e_step, "measured": m_step,
                        "layer_median": float(np.median(errors(e_layers[big], m_layers[big]))),
                        "layers": int(big.sum())})
    return out


# ---- 5. the A100 Kineto trace ----

def kineto(fits, cache) -> list[tuple[str, float, float]]:
    """(kind, predicted device seconds, measured) per kind of kernel, ResNet-50 batch 32 on the A100."""
    gpu = DEVICES.get("a100")
    measured = data.kineto_kernels()
    launches, _ = cached(cache, "zoo|resnet50|32|torch|a100|ddp",
                         lambda: data.zoo_program("resnet50", 32, "torch", gpu, loop="training"))
    seconds, _, _ = kernel_times(model_of(fits["a100"]), launches, gpu)
    predicted: dict[str, float] = {}
    for x, t in zip(launches, seconds, strict=True):
        kind = data.launch_kind(x)
        predicted[kind] = predicted.get(kind, 0.0) + float(t)
    return [(k, predicted.get(k, 0.0), measured.get(k, 0.0)) for k in sorted(set(predicted) | set(measured))]


def held_out(cache: Path | None, cap: int = CAP, only=None):
    """(the fit on every GPU, {gpu: fit without it}, the held-out kernel rows, the host scales per machine): parts
    1 and 2 (bench/compute_estimates.py reuses them)."""
    tables, rows_all = data.kernel_tables(cap), data.kernel_tables(ALL_ROWS)
    print("kernel rows learned from: " + ", ".join(f"{f} {len(t['gpu'])}" for f, t in tables.items())
          + "; for the shape corrections and judged: " + ", ".join(f"{f} {len(t['gpu'])}" for f, t in
                                                                    rows_all.items()), flush=True)
    everything = cached(cache, f"all3|{cap}", lambda: F.fit(tables, corrections_from=rows_all))
    fits, op_rows = leave_one_gpu_out(tables, cache, cap, rows_all, only)
    if only:
        return everything, fits, op_rows, None
    scales = cached(cache, f"scales5|{cap}", lambda: machine_scales(fits, everything, cache))
    return everything, fits, op_rows, scales


# ---- 6. NeuSight's whole-step labels ----

def neusight_steps(fits, everything, host) -> list[tuple[str, str, float, float]]:
    """(gpu, what, predicted, measured) of NeuSight's training labels, each with the model without its GPU."""
    import json as _json

    from simfog.gpu.model import program

    out = []
    for r in data.neusight_labels():
        gpu = DEVICES.get(r["gpu"])
        config_name, seq = r["model"].rsplit("-s", 1)
        config = _json.loads((data.KERNELS / "neusight" / "models" / f"{config_name}.json").read_text())
        layers = data.transformer_ops(config, r["batch"], int(seq))
        launches = [x for x in program(layers, [[]] * len(layers), "fp32", gpu) if x.phase != "optimizer"]
        seconds, _, _ = kernel_times(model_of(fits.get(gpu.name, everything)), launches, gpu)
        added, _ = H.timeline(seconds, H.issue_gaps(launches, host))
        out.append((gpu.name, f"{r['model']} b{r['batch']}", float(added.sum()), r["time_s"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cap", type=int, default=CAP, help="rows per (source, GPU, precision, pass) learned from")
    parser.add_argument("--cache", type=Path, default=None, help="keep the fits here between runs")
    parser.add_argument("--write", action="store_true", help="write simfog/data/gpu_model.json")
    parser.add_argument("--dev", action="store_true", help="part 1 on the development GPUs only (DEV_GPUS)")
    args = parser.parse_args()
    everything, fits, op_rows, scales = held_out(args.cache, args.cap, DEV_GPUS if args.dev else None)
    report_ops(op_rows)
    if args.dev:
        return
    host = default_host(scales)
    print("\n2. host scale per machine (us per operator dispatched; median over its passes):")
    for key in sorted(scales):
        print(f"  {key:40s} {np.median(scales[key]) * 1e6:7.1f} us  ({len(scales[key])} passes)")
    print("shipped: " + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in host.items()))
    public = public_step_scores(fits, everything, scales, args.cache)
    scores = [abs(math.log(m / p)) for _, p, m in public]
    print(f"\n3. public training iterations held out ({len(public)}): median {pct(math.expm1(np.median(scores)))}, "
          f"90th percentile {pct(math.expm1(np.quantile(scores, 0.9)))}")
    for what, p, m in public:
        print(f"  {what:72s} {p * 1e3:8.2f} ms vs {m * 1e3:8.2f} ms  {math.log(m / p):+.3f}")
    q90 = conformal_quantile(scores, 0.9)
    model = GpuModel(everything.params, everything.corrections, host)
    runs = h200(model)
    print("\n4. the zoo on an H200 (never learned from): step predicted vs measured, per-layer median |error|")
    inside = 0
    for r in runs:
        hit = abs(math.log(r["measured"] / r["predicted"])) <= q90
        inside += hit
        print(f"  {r['run']:36s} {r['predicted'] * 1e3:8.2f} ms vs {r['measured'] * 1e3:8.2f} ms "
              f"{100 * (r['predicted'] / r['measured'] - 1):+6.1f}%  layers {pct(r['layer_median'])} "
              f"({r['layers']} of >= 1 % of the step){'' if hit else '  OUTSIDE the 90 % interval'}")
    step_err = errors([r["predicted"] for r in runs], [r["measured"] for r in runs])
    coverage = inside / len(runs)
    print(f"90 % interval: x/ {math.exp(q90):.3f} (conformal on the {len(scores)} public steps); covers "
          f"{inside} of {len(runs)} H200 steps")
    print("\n5. A100 Kineto trace (ResNet-50 b32, HTA): GPU time per step by kind, model (without the A100) vs trace")
    kin = kineto(fits, args.cache)
    for kind, p, m in kin:
        print(f"  {kind:12s} {p * 1e3:8.2f} ms vs {m * 1e3:8.2f} ms")
    tp, tm = sum(p for _, p, _ in kin), sum(m for _, _, m in kin)
    print(f"  {'total':12s} {tp * 1e3:8.2f} ms vs {tm * 1e3:8.2f} ms  {100 * (tp / tm - 1):+.1f}%")
    print("\n6. NeuSight's training labels (forward + backward, FP32), each GPU with the model without it:")
    labels = neusight_steps(fits, everything, host)
    for gpu in sorted({g for g, *_ in labels}):
        e = errors([p for g, _, p, _ in labels if g == gpu], [m for g, _, _, m in labels if g == gpu])
        print(f"  {gpu:16s} {len(e):2d} steps  median {pct(np.median(e)):>7s}  worst {pct(np.max(e)):>7s}")
    for gpu, what, p, m in labels:
        if gpu in ("h100", "a100-pcie-80gb", "l4"):
            print(f"    {gpu:16s} {what:24s} {p * 1e3:9.1f} ms vs {m * 1e3:9.1f} ms  {100 * (p / m - 1):+6.1f}%")
    op_err = [r[5] for r in op_rows]
    if args.write:
        write(everything, host, op_err, scores, coverage)
    print(f"gpus={len(fits)} ops={len(op_err)} op_median={pct(np.median(op_err))} "
          f"op_p90={pct(np.quantile(op_err, 0.9))} step_median={pct(np.median(step_err))} "
          f"step_worst={pct(np.max(step_err))} coverage90={pct(coverage)}")


def write(everything: F.Fitted, host: dict, op_err, scores, coverage) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    provenance = {
        "learned_from": "bench/data/kernels (NeuSight, DeepBench, Vidur, KernelBench kernels; pytorch-gpu-benchmark "
                        "and KernelBench whole passes for the host); never the H200 runs of traces/h200",
        "generated": datetime.now(UTC).strftime("%Y-%m-%d"), "commit": commit,
        "command": "python bench/retarget.py --write",
        "held_out": {"op_median": float(np.median(op_err)), "op_p90": float(np.quantile(op_err, 0.9)),
                     "ops": len(op_err), "public_step_median": float(math.expm1(np.median(scores))),
                     "public_steps": len(scores), "h200_coverage90": coverage},
    }
    GpuModel(everything.params, everything.corrections, host, provenance).save(ROOT / "simfog" / "data" /
                                                                              "gpu_model.json")
    print("wrote simfog/data/gpu_model.json (the compute interval's scores: python bench/compute_estimates.py "
          "--write)")


if __name__ == "__main__":
    main()
