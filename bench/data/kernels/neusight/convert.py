"""Convert NeuSight's public per-operator measurements into bench/data/kernels' common CSVs (gemm.csv, conv.csv,
memory.csv, steps.csv) and copy its device and model configurations byte for byte.

Run: python bench/data/kernels/neusight/convert.py PATH-TO-A-CLONE-OF-sitar-lab/NeuSight (any clone or bare mirror
holding COMMIT). PROVENANCE.md says what is read and what is left out.
"""

from __future__ import annotations

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
    git_text,
    precision_of_kernel,
    read_csv,
    seconds,
    short_kernel,
    write_csv,
    write_sums,
)

from simfog.gpu.specs import DEVICES  # noqa: E402

COMMIT = "6945927d9afcca2b9daf021f8395e53edc5b4eef"
DATA = "scripts/asplos/data"
HERE = Path(__file__).resolve().parent
ELEMENTWISE = {"add", "addu", "mul", "mulu", "div", "divu", "pow", "powu", "tanh", "relu", "gelu"}


def gpu(name: str) -> str | None:
    """simfog's name of NeuSight's device string; None for a GPU simfog's table leaves out (AMD)."""
    found = DEVICES.find(name)
    return found.name if found else None


def gemms(repo, path: str, op: str, split: str) -> list[dict]:
    """Rows of a linear or bmm table. linear: nn.Linear(N, K) on (B, M, N): B*M rows, reduction N, K outputs; bmm:
    (B, M, N) x (B, N, K)."""
    out = []
    for r in read_csv(git_text(repo, COMMIT, path)):
        g = gpu(r["Device"])
        if g is None or r["OPName"] != op:
            continue
        b, m, n, k = (int(r[x]) for x in ("B", "M", "N", "K"))
        row = {"batch": 1, "m": b * m, "n": k, "k": n, "bias": 1} if op == "linear" else \
            {"batch": b, "m": m, "n": k, "k": n, "bias": 0}
        out.append({"source": "neusight", "set": split, "gpu": g, "precision": precision_of_kernel(r["Kernel Name"]),
                    "layout": "", "time_s": seconds(r["Latency"]), "kernel": short_kernel(r["Kernel Name"]), **row})
    return out


def convs(repo, path: str) -> list[dict]:
    """Rows of a conv table: nn.Conv2d(C, K, R, stride, padding, bias=False) on B x C x S x S images."""
    out = []
    for r in read_csv(git_text(repo, COMMIT, path)):
        g = gpu(r["Device"])
        if g is None:
            continue
        kernels = [k for k in r["Kernels"].split(";") if k]
        size, ks, stride, pad = (int(r[x]) for x in ("Input_Size", "Kernel_Szie", "Stride", "Padding"))
        out.append({"source": "neusight", "set": "train", "gpu": g,
                    "precision": precision_of_kernel(r["Kernel Name"]), "pass": "fwd", "n": int(r["B"]),
                    "c": int(r["Input_Channel"]), "h": size, "w": size, "k": int(r["Output_Channel"]), "r": ks,
                    "s": ks, "stride_h": stride, "stride_w": stride, "pad_h": pad, "pad_w": pad, "dilation": 1,
                    "groups": 1, "time_s": seconds(r["Latency"]),
                    "algorithm": "+".join(short_kernel(k) for k in kernels)[:160]})
    return out


def memories(repo, path: str, split: str) -> list[dict]:
    out = []
    for r in read_csv(git_text(repo, COMMIT, path)):
        g = gpu(r["Device"])
        if g is None:
            continue
        op = r["OPName"]
        kind = "elementwise" if op in ELEMENTWISE else {"ln": "norm", "softmax": "softmax"}.get(op)
        if kind is None:
            continue
        out.append({"source": "neusight", "set": split, "gpu": g, "precision": "fp32", "op": op, "kind": kind,
                    "rows": int(r["B"]), "cols": int(r["H"]), "time_s": seconds(r["Latency"]),
                    "kernel": short_kernel(r["Kernel Name"])})
    return out


def steps(repo) -> list[dict]:
    """NeuSight's whole-model training labels (label/<GPU>/<model>-train-<seq>-<batch>.json: fw, bw, e2e ms)."""
    out = []
    for path in git_files(repo, COMMIT, "scripts/asplos/label"):
        name = path.rsplit("/", 1)[-1]
        parts = name.removesuffix(".json").split("-")
        if not name.endswith(".json") or len(parts) != 4 or parts[1] != "train":
            continue  # inference, fused, and distributed (dp/tp/pp) labels are left out
        g = gpu(path.split("/")[-2].replace("_", " "))
        if g is None:
            continue
        label = json.loads(git_text(repo, COMMIT, path))
        model, _, seq, batch = parts
        for phase, key in (("train", "e2e_latency"), ("forward", "fw_latency"), ("backward", "bwall_latency")):
            out.append({"source": "neusight", "gpu": g, "precision": "fp32", "model": f"{model}-s{seq}",
                        "batch": int(batch), "phase": phase, "time_s": seconds(label[key]),
                        "note": f"{path} ({label['num_layer']} layers)"})
    return out


def main() -> None:
    repo = sys.argv[1]
    base = f"{DATA}/dataset"
    gemm = []
    for op in ("linear", "bmm"):
        for path in git_files(repo, COMMIT, f"{base}/train/collect/{op}"):
            gemm += gemms(repo, path, op, "train")
        gemm += gemms(repo, f"{base}/test/{op}.csv", op, "test")
    conv = [row for path in git_files(repo, COMMIT, f"{base}/train/collect/conv") for row in convs(repo, path)]
    memory = []
    for split in ("train", "test"):
        for table in ("elem", "ln", "softmax"):
            memory += memories(repo, f"{base}/{split}/{table}.csv", split)
    write_csv(HERE / "gemm.csv.gz", GEMM_COLUMNS, gemm)
    write_csv(HERE / "conv.csv.gz", CONV_COLUMNS, conv)
    write_csv(HERE / "memory.csv.gz", MEMORY_COLUMNS, memory)
    write_csv(HERE / "steps.csv", STEP_COLUMNS, steps(repo))
    for folder, target in ((f"{DATA}/device_configs", "device_configs"), (f"{DATA}/DLmodel_configs", "models")):
        (HERE / target).mkdir(exist_ok=True)
        for path in git_files(repo, COMMIT, folder):
            if "AMD" not in path:
                (HERE / target / path.rsplit("/", 1)[-1]).write_bytes(git_bytes(repo, COMMIT, path))
    write_sums(HERE)


if __name__ == "__main__":
    main()
