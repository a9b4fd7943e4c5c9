"""Convert KernelBench's per-GPU baseline timings (results/timing/<GPU>/baseline_time_torch.json: PyTorch eager,
forward only, fp32 inputs, 100 trials) into bench/data/kernels' common CSVs, and record what each problem computes.

The timings are copied byte for byte into timing/. Each problem's shapes are not in the timings but in its problem
file (KernelBench/level{1,2,3}/*.py at the same commit): each is run once here on "meta" tensors (shapes only) under
validate/collect/layer_ops.py's recorder, which lists its calls (kind, shapes) in simfog.gpu.ops's format:
problems.json.gz. Level-1 problems that are one convolution, matrix product, normalisation, softmax, pooling or
element-wise call become rows of conv.csv.gz, gemm.csv.gz and memory.csv.gz; every problem (levels 1-3) with its
calls is in problems.json.gz and its times in models.csv.gz (whole forward passes).

Precision: KernelBench ran torch 2.5 with its defaults, so convolutions ran in TF32 on GPUs with TF32 (cuDNN's
allow_tf32 is on by default) and matrix products in FP32.

Run (needs torch): python bench/data/kernels/kernelbench/convert.py PATH-TO-A-CLONE-OF-ScalingIntelligence/KernelBench
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import (  # noqa: E402
    CONV_COLUMNS,
    GEMM_COLUMNS,
    MEMORY_COLUMNS,
    STEP_COLUMNS,
    git_bytes,
    git_files,
    seconds,
    write_csv,
    write_sums,
)

from simfog.gpu.specs import DEVICES  # noqa: E402

COMMIT = "b5cc6a4b74d83c2a10bc070a8cea5ff336166cf3"  # the last commit with all 12 GPUs' timings (2025-06-22)
HERE = Path(__file__).resolve().parent
FOLDERS = ("A100-80GB_modal", "A100_modal", "A10G_modal", "A6000_babel", "B200_together", "H100_together",
           "L40S_babel", "L40S_matx3", "L40S_modal", "L4_modal", "RTX_3090_Ti", "T4_modal")


def record_problem(source: str) -> list[dict]:
    """The calls of one forward pass of a problem file's Model, on meta tensors."""
    import torch

    from validate.collect.layer_ops import _Recorder

    namespace: dict = {}
    torch.manual_seed(0)
    with torch.device("meta"):
        exec(compile(source, "<problem>", "exec"), namespace)  # noqa: S102 (KernelBench's own problem file)
        model = namespace["Model"](*namespace["get_init_inputs"]())
        inputs = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in namespace["get_inputs"]()]
        recorder = _Recorder()
        with torch.no_grad(), recorder:
            model(*inputs)
    return recorder.pending


def precision(kind: str, gpu) -> str:
    return "tf32" if kind == "conv" and gpu.has_tensor_cores("tf32") else "fp32"


def rows(problem: str, ops: list[dict], gpu, entry: dict, folder: str) -> tuple[str, dict] | None:
    """(table, row) for a level-1 problem of one kernel-launching call, else None."""
    main = [o for o in ops if o["kind"] != "elementwise" or o["op"] not in {"zeros", "ones", "full", "arange"}]
    if len(main) != 1:
        return None
    o = main[0]
    base = {"source": "kernelbench", "set": folder, "gpu": gpu.name, "precision": precision(o["kind"], gpu),
            "time_s": seconds(entry["mean"])}
    if o["kind"] == "matmul":
        return "gemm", {**base, "batch": o["b"], "m": o["m"], "n": o["n"], "k": o["k"], "layout": "",
                        "bias": int(o.get("bias", False)), "kernel": problem}
    if o["kind"] == "conv" and o["op"] == "conv2d":
        return "conv", {**base, "pass": "fwd", "n": o["n"], "c": o["c"], "h": o["h"], "w": o["w"], "k": o["k"],
                        "r": o["r"], "s": o["s"], "stride_h": o["stride"][0], "stride_w": o["stride"][1],
                        "pad_h": o["pad"][0], "pad_w": o["pad"][1], "dilation": o["dilation"][0],
                        "groups": o["groups"], "algorithm": problem}
    if o["kind"] in {"elementwise", "norm", "softmax", "pool"}:
        cols = o.get("cols") or o.get("features") or 1
        elements = o.get("elements", o.get("elements_in", 0))
        return "memory", {**base, "op": o.get("type", o["op"]) if o["kind"] in {"norm", "pool"} else o["op"],
                          "kind": o["kind"], "rows": elements // max(1, cols), "cols": cols, "kernel": problem}
    return None


def main() -> None:
    repo = sys.argv[1]
    (HERE / "timing").mkdir(exist_ok=True)
    timings = {}
    for folder in FOLDERS:
        data = git_bytes(repo, COMMIT, f"results/timing/{folder}/baseline_time_torch.json")
        (HERE / "timing" / f"{folder}.json").write_bytes(data)
        timings[folder] = json.loads(data)
    problems, skipped = {}, {}
    for level in ("level1", "level2", "level3"):
        for path in git_files(repo, COMMIT, f"KernelBench/{level}"):
            name = path.rsplit("/", 1)[-1]
            try:
                problems[f"{level}/{name}"] = record_problem(git_bytes(repo, COMMIT, path).decode())
            except Exception as e:  # a problem the meta device cannot run (data-dependent shapes, .item())
                skipped[f"{level}/{name}"] = f"{type(e).__name__}: {str(e)[:120]}"
    tables = {"gemm": [], "conv": [], "memory": []}
    models = []
    for folder, data in timings.items():
        for level, entries in data.items():
            for name, entry in entries.items():
                ops = problems.get(f"{level}/{name}")
                if not entry:  # a problem that failed on that GPU: null in the timings
                    continue
                gpu = DEVICES.find(entry["hardware"])
                if ops is None or gpu is None:
                    continue
                models.append({"source": "kernelbench", "gpu": gpu.name, "precision": "torch-default",
                               "model": f"{level}/{name}", "batch": 0, "phase": "forward",
                               "time_s": seconds(entry["mean"]), "note": folder})
                found = rows(name, ops, gpu, entry, folder) if level == "level1" else None
                if found:
                    tables[found[0]].append(found[1])
    write_csv(HERE / "gemm.csv.gz", GEMM_COLUMNS, tables["gemm"])
    write_csv(HERE / "conv.csv.gz", CONV_COLUMNS, tables["conv"])
    write_csv(HERE / "memory.csv.gz", MEMORY_COLUMNS, tables["memory"])
    write_csv(HERE / "models.csv.gz", STEP_COLUMNS, models)
    blob = json.dumps({"format": "simfog.layer-ops/1", "commit": COMMIT, "problems": problems, "skipped": skipped},
                      indent=0, sort_keys=True).encode()
    with (HERE / "problems.json.gz").open("wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as z:
        z.write(blob)
    print(f"{len(problems)} problems recorded, {len(skipped)} skipped: {sorted(skipped)}")
    write_sums(HERE)


if __name__ == "__main__":
    main()
