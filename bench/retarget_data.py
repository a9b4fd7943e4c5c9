"""The measurements bench/retarget.py learns from and judges on, read from bench/data and traces/ (see
bench/data/kernels/README.md for the sources): the kernel tables, the public whole steps with their programs, the
H200 runs, and the A100 Kineto trace's kernels.

Whole steps are programs of launches (simfog.gpu.model.program) with what the measurement's loop adds around them:
pytorch-gpu-benchmark's train loop times zero_grad (a fill per parameter tensor on torch 1.x), the batch's copy to
the GPU (pageable, at PAGEABLE_Bps: an assumption), forward, the loss and backward, no optimizer step; KernelBench
times one forward pass under no_grad.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import numpy as np

from simfog.gpu import layers as L
from simfog.gpu.model import program
from simfog.gpu.specs import DEVICES

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "bench" / "data" / "kernels"
FAMILIES = ("gemm", "conv", "memory")
PAGEABLE_Bps = 6e9  # a pageable host-to-device copy (PCIe 3.0 x16 with a staging copy): assumed, not measured
ZOO_STEPS = ("resnet50", "vgg16", "densenet121")  # pytorch-gpu-benchmark's models that the zoo holds
KINETO_A100 = ROOT / "bench" / "data" / "ref" / "kineto-nccl" / "nccl_parser_config" / "nccl_data.json.gz"


def read_csv(path: Path) -> list[dict]:
    data = path.read_bytes()
    return list(csv.DictReader(io.StringIO((gzip.decompress(data) if path.suffix == ".gz" else data).decode())))


def kernel_tables(cap: int, seed: int = 0) -> dict[str, dict[str, list]]:
    """{family: table}: every source's rows of each family, at most `cap` per (source, GPU, precision, pass or kind)
    drawn with `seed` (the fit's cost grows with the rows; the groups stay balanced)."""
    out = {}
    rng = np.random.default_rng(seed)
    for family in FAMILIES:
        groups: dict[tuple, list] = {}
        for source in sorted(p for p in KERNELS.iterdir() if p.is_dir()):
            path = source / f"{family}.csv.gz"
            for row in read_csv(path) if path.exists() else []:
                if float(row["time_s"]) > 0 and DEVICES.find(row["gpu"]):
                    key = (row["source"], row["gpu"], row["precision"], row.get("pass", ""), row.get("kind", ""))
                    groups.setdefault(key, []).append(row)
        rows = []
        for key in sorted(groups):
            picked = sorted(rng.permutation(len(groups[key]))[:cap])
            rows += [groups[key][i] for i in picked]
        out[family] = {col: [r.get(col, "") for r in rows] for col in rows[0]} if rows else {"gpu": []}
    return out


def zoo_program(model: str, batch: int, precision: str, gpu, *, loop: str = "pytorch-gpu-benchmark"):
    """The launches of one measured iteration of zoo model `model` (recorded on meta tensors: needs torch)."""
    import torch

    from validate.collect.layer_ops import zoo_ops
    from validate.collect.models import build

    order, ops = zoo_ops(model, batch)
    with torch.device("meta"):
        net = build(model)
    leaves = dict(net.named_modules())
    params = [[p.numel() for p in leaves[name].parameters(recurse=False)] for name in order]
    launches = program([ops[name] for name in order], params, precision, gpu)
    size = 2 if precision == "fp16" else 4
    if loop == "inference":  # eval mode under no_grad: the forward only (dropout runs no kernel), and the copy in
        forward = [x for x in launches if x.phase == "forward" and "dropout" not in x.what]
        return forward, batch * 3 * 224 * 224 * size / PAGEABLE_Bps
    if loop == "pytorch-gpu-benchmark":  # no optimizer; zero_grad fills every gradient; the batch is copied in
        launches = [x for x in launches if x.phase != "optimizer"]
        fills = [L.Launch(-1, "forward", -1, "zero_grad", False, (), size * n, "elementwise")
                 for sizes in params for n in sizes]
        copy_s = batch * 3 * 224 * 224 * size / PAGEABLE_Bps
        return fills + launches, copy_s
    return launches, 0.0


def public_steps(phase: str = "train") -> list[dict]:
    """pytorch-gpu-benchmark's iterations (`phase` train or inference) of the zoo's models: gpu, precision, model,
    batch, time_s, note."""
    rows = read_csv(KERNELS / "pytorch-gpu-benchmark" / "steps.csv")
    return [dict(r, time_s=float(r["time_s"]), batch=int(r["batch"])) for r in rows
            if r["phase"] == phase and r["model"] in ZOO_STEPS]


def kernelbench_forwards(levels=("level2", "level3")) -> tuple[dict, list[dict]]:
    """(problem -> its calls, timing rows) of KernelBench's multi-call problems (one forward pass under no_grad)."""
    blob = json.loads(gzip.decompress((KERNELS / "kernelbench" / "problems.json.gz").read_bytes()))
    problems = {k: v for k, v in blob["problems"].items() if k.split("/")[0] in levels and v}
    rows = [dict(r, time_s=float(r["time_s"])) for r in read_csv(KERNELS / "kernelbench" / "models.csv.gz")
            if r["model"] in problems and DEVICES.find(r["gpu"])]
    return problems, rows


def forward_program(ops: list[dict], precision: str, gpu):
    """The forward launches of a list of calls (one layer), as under no_grad."""
    from simfog.gpu.model import program as prog

    return [x for x in prog([ops], [[]], precision, gpu) if x.phase == "forward"]


def h200_runs() -> list[tuple[Path, list[Path]]]:
    """(CPU trace, its H200 runs) for every CPU trace with runs in traces/h200/."""
    out = []
    for cpu in sorted((ROOT / "traces").glob("*-cpu-*.json.gz")):
        model, batch = cpu.name.removesuffix(".json.gz").split("-cpu-")
        runs = sorted((ROOT / "traces" / "h200").glob(f"{model}-h200-{batch}-run*.json.gz"))
        if runs:
            out.append((cpu, runs))
    return out


def kineto_kernels(path: Path = KINETO_A100) -> dict[str, float]:
    """The A100 trace's mean GPU time per step (seconds) of its compute kernels by kind (the launching operator's:
    conv, norm, elementwise, pool, matmul, loss, optimizer, other; NCCL and DDP's bucket copies left out)."""
    d = json.loads(gzip.decompress(path.read_bytes()))
    events = d["traceEvents"]
    steps = sorted((e for e in events if e.get("name", "").startswith("ProfilerStep")), key=lambda e: e["ts"])
    runtime = {e["args"].get("correlation"): e for e in events if e.get("cat") == "cuda_runtime"}
    ops = {e["args"].get("External id"): e["name"] for e in events if e.get("cat") == "cpu_op"}
    totals: dict[str, float] = {}
    for e in events:
        if e.get("cat") != "kernel" or "nccl" in e["name"].lower():
            continue
        launch = runtime.get(e["args"].get("correlation"))
        if launch is None or not any(s["ts"] <= launch["ts"] <= s["ts"] + s["dur"] for s in steps):
            continue
        kind = kineto_kind(ops.get(e["args"].get("External id"), ""), e["name"])
        if kind:
            totals[kind] = totals.get(kind, 0.0) + e["dur"] * 1e-6 / len(steps)
    return totals


def kineto_kind(op: str, kernel: str) -> str | None:
    """The kind of a kernel by its launching operator (None: DDP's copies, left out)."""
    o = op.lower()
    if "cat" in o or "copy_" in o and "foreach" not in o:
        return None
    for key, kind in (("convolution", "conv"), ("batch_norm", "norm"), ("foreach", "optimizer"),
                      ("max_pool", "pool"), ("avg_pool", "pool"), ("addmm", "matmul"), ("mm", "matmul"),
                      ("softmax", "loss"), ("nll", "loss"), ("threshold", "elementwise"), ("relu", "elementwise"),
                      ("add", "elementwise"), ("mul", "elementwise"), ("div", "elementwise"), ("sum", "other"),
                      ("fill", "other"), ("zero", "other")):
        if key in o:
            return kind
    return "other"


def launch_kind(x) -> str:
    """The kind (as kineto_kind names them) of a simfog launch."""
    w = x.what
    if x.phase == "optimizer":
        return "optimizer"
    for key, kind in (("conv", "conv"), ("norm", "norm"), ("pool", "pool"), ("linear", "matmul"),
                      ("cross_entropy", "loss"), ("bias grad", "other")):
        if key in w:
            return kind
    return "elementwise"


def neusight_labels() -> list[dict]:
    """NeuSight's whole-model training labels (steps.csv: forward + backward per iteration, FP32) of the dense
    models (the Switch MoE left out): gpu, model (<config>-s<seq>), batch, time_s."""
    rows = read_csv(KERNELS / "neusight" / "steps.csv")
    return [dict(r, time_s=float(r["time_s"]), batch=int(r["batch"])) for r in rows
            if r["phase"] == "train" and not r["model"].startswith("switch")]


def transformer_ops(config: dict, batch: int, seq: int) -> list[list[dict]]:
    """The operators, layer by layer, of a HuggingFace GPT-2, OPT or BERT (pre-training heads) model as NeuSight
    ran it (eager attention: two batched products, the scale, the mask, softmax and dropout between them; GPT-2's
    gelu_new as its eight element-wise calls), from its configuration (bench/data/kernels/neusight/models/)."""
    gpt2 = "n_embd" in config
    h = config.get("n_embd") or config["hidden_size"]
    heads = config.get("n_head") or config["num_attention_heads"]
    layers = config.get("n_layer") or config["num_hidden_layers"]
    inner = config.get("n_inner") or config.get("ffn_dim") or config.get("intermediate_size") or 4 * h
    vocab = config["vocab_size"]
    t, scores = batch * seq, batch * heads * seq * seq

    def mm(m, n, k, bias=True, b=1):
        return {"kind": "matmul", "op": "linear", "dtype": "float32", "grad": True, "b": b, "m": m, "n": n, "k": k,
                "bias": bias}

    def ew(op, elements, inputs=1):
        return {"kind": "elementwise", "op": op, "dtype": "float32", "grad": True, "elements": elements,
                "inputs": inputs}

    def ln(elements):
        return {"kind": "norm", "op": "layer_norm", "dtype": "float32", "grad": True, "type": "layer",
                "elements": elements, "features": h}

    def emb(rows, table):
        return {"kind": "embedding", "op": "embedding", "dtype": "float32", "grad": True, "indices": rows, "dim": h,
                "vocab": table}

    attention = [{**mm(seq, seq, h // heads, False, batch * heads), "op": "matmul"}, ew("div", scores),
                 ew("where" if gpt2 or "ffn_dim" in config else "add", scores),
                 {"kind": "softmax", "op": "softmax", "dtype": "float32", "grad": True, "elements": scores,
                  "cols": seq}, ew("dropout", scores),
                 {**mm(seq, h // heads, seq, False, batch * heads), "op": "matmul"}]
    act = config.get("activation_function", config.get("hidden_act", "gelu"))
    gelu = [ew(op, t * inner, 2 if op in ("add", "mul") and i in (3, 7) else 1) for i, op in enumerate(
        ("mul", "pow", "mul", "add", "mul", "tanh", "add", "mul"))] if act == "gelu_new" else [ew(act, t * inner)]
    qkv = [mm(t, 3 * h, h)] if gpt2 else [mm(t, h, h) for _ in range(3)]
    block = [ln(t * h), *qkv, *attention, mm(t, h, h), ew("dropout", t * h), ew("add", t * h, 2), ln(t * h),
             mm(t, inner, h), *gelu, mm(t, h, inner), ew("dropout", t * h), ew("add", t * h, 2)]
    positions = config.get("n_positions") or config.get("max_position_embeddings", seq)
    head = [emb(t, vocab), emb(t, positions), ew("add", t * h, 2), ew("dropout", t * h)]
    tail = [ln(t * h), mm(t, vocab, h, False)]
    if "intermediate_size" in config:  # BERT: post-norm blocks, a token-type embedding, the pooler and both heads
        head = [emb(t, vocab), emb(t, 2), emb(t, positions), ew("add", t * h, 2), ln(t * h), ew("dropout", t * h)]
        tail = [mm(batch, h, h), ew("tanh", batch * h), mm(t, h, h), ew("gelu", t * h), ln(t * h),
                mm(t, vocab, h), mm(batch, 2, h)]
    return [head] + [block] * layers + [tail]
