"""Convert ryujaehun/pytorch-gpu-benchmark's single-GPU results (torchvision models, batch 12, per-iteration times
in ms) into bench/data/kernels' steps.csv, and copy the CSVs read byte for byte into raw/.

Each row of a result file is one timed iteration, each column a model. "train" iterations time zero_grad, the batch's
copy to the GPU, forward, the loss and backward (no optimizer step); "inference" iterations the copy and a forward
pass under no_grad in eval mode (benchmark_models.py at the same commit). steps.csv keeps the median over the
iterations (the mean, which the project's plots show, in `note`).

Run: python bench/data/kernels/pytorch-gpu-benchmark/convert.py PATH-TO-A-CLONE-OF-ryujaehun/pytorch-gpu-benchmark
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import STEP_COLUMNS, git_bytes, git_files, read_csv, write_csv, write_sums  # noqa: E402

COMMIT = "3f47a9e2a43ca751ffade0add700b54b00e44bf0"
HERE = Path(__file__).resolve().parent
GPUS = {"GeForce GTX 1080 Ti": "gtx-1080-ti", "GeForce RTX 2080 Ti": "rtx-2080-ti", "TITAN Xp": "titan-xp",
        "TITAN RTX": "titan-rtx", "TITAN V": "titan-v", "A100-SXM4-40GB": "a100"}


def parse(path: str) -> tuple[str, str, str] | None:
    """(simfog GPU, precision, phase) of a one-GPU float/half result file, else None."""
    name = path.rsplit("/", 1)[-1]
    if "double" in name or any(f"_{n}_gpus" in name for n in (2, 3, 4)) or not name.endswith(".csv"):
        return None
    gpu = next((g for label, g in GPUS.items() if name.startswith(label)), None)
    kind = "half" if "_half_" in name else "float" if ("_float_" in name or "_single_" in name) else None
    phase = "train" if "_train" in name else "inference" if "_inference" in name else None
    if gpu is None or kind is None or phase is None:
        return None
    # torch 1.7 on the A100 (CUDA 11.1, cuDNN 8.0.4) ran float convolutions and matrix products in TF32 by default
    precision = "fp16" if kind == "half" else "tf32" if gpu == "a100" else "fp32"
    return gpu, precision, phase


def main() -> None:
    repo = sys.argv[1]
    rows, seen = [], set()
    (HERE / "raw").mkdir(exist_ok=True)
    for path in git_files(repo, COMMIT, "results") + git_files(repo, COMMIT, "new_results"):
        found = parse(path)
        if found is None:
            continue
        gpu, precision, phase = found
        data = git_bytes(repo, COMMIT, path)
        if data in seen:  # new_results/ repeats results/2080ti(2)/ byte for byte
            continue
        seen.add(data)
        target = path.replace("/", "__").replace(" ", "_")
        (HERE / "raw" / target).write_bytes(data)
        table = read_csv(data.decode())
        for model in table[0]:
            times = [float(r[model]) for r in table if r.get(model)]
            rows.append({"source": "pytorch-gpu-benchmark", "gpu": gpu, "precision": precision, "model": model,
                         "batch": 12, "phase": phase, "time_s": f"{statistics.median(times) * 1e-3:.6g}",
                         "note": f"raw/{target}: {len(times)} iterations, mean {statistics.fmean(times):.4g} ms"})
    write_csv(HERE / "steps.csv", STEP_COLUMNS, rows)
    write_sums(HERE)


if __name__ == "__main__":
    main()
