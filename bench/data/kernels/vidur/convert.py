"""Convert Vidur's compute profiles (data/profiling/compute/<GPU>/<model>/mlp.csv: one transformer layer's operators
of LLMs in FP16, timed by the profiler's CUDA kernel time, for 1-4096 tokens and 1-8 tensor-parallel workers) into
bench/data/kernels' gemm.csv.gz: the layer's four matrix products (QKV and output projections, MLP up and down).

The operators vLLM runs as its own kernels (RMSNorm, rotary embedding, SiLU-and-mul) are left out, as are the
attention profiles (attention.csv: absent from the public snapshot). Token counts are a subset: powers of two and
1.5 x powers of two (the profiles step by 8 tokens; neighbours add little).

Run: python bench/data/kernels/vidur/convert.py PATH-TO-A-CLONE-OF-microsoft/vidur
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import GEMM_COLUMNS, git_files, git_text, read_csv, seconds, write_csv, write_sums  # noqa: E402

COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
HERE = Path(__file__).resolve().parent
GPUS = {"a100": "a100-80gb", "a40": "a40", "h100": "h100"}  # Vidur's README: A100 80GB DGX, H100 DGX, A40 nodes
TOKENS = {2**i for i in range(13)} | {3 * 2**i for i in range(12)}


def gemms(row: dict) -> list[tuple[str, int, int, int]]:
    """(operator, m, n, k) of the layer's matrix products: m tokens, n outputs, k reduction, per worker."""
    heads, kv, hidden = int(row["n_head"]), int(row["n_kv_head"]), int(row["n_embd"])
    inner, tp, tokens = int(row["n_expanded_embd"]), int(row["num_tensor_parallel_workers"]), int(row["num_tokens"])
    head_dim = hidden // heads
    gated = row["use_gated_mlp"] == "True"
    return [("attn_pre_proj", tokens, (heads + 2 * kv) * head_dim // tp, hidden),
            ("attn_post_proj", tokens, hidden, heads * head_dim // tp),
            ("mlp_up_proj", tokens, inner * (2 if gated else 1) // tp, hidden),
            ("mlp_down_proj", tokens, hidden, inner // tp)]


def main() -> None:
    repo = sys.argv[1]
    out = []
    for path in git_files(repo, COMMIT, "data/profiling/compute"):
        parts = path.split("/")
        if parts[-1] != "mlp.csv" or parts[3] not in GPUS:
            continue
        model = "/".join(parts[4:-1])
        for row in read_csv(git_text(repo, COMMIT, path)):
            if int(row["num_tokens"]) not in TOKENS:
                continue
            for op, m, n, k in gemms(row):
                out.append({"source": "vidur", "set": model, "gpu": GPUS[parts[3]], "precision": "fp16", "batch": 1,
                            "m": m, "n": n, "k": k, "layout": "", "bias": 0,
                            "time_s": seconds(row[f"time_stats.{op}.median"]), "kernel": op})
    write_csv(HERE / "gemm.csv.gz", GEMM_COLUMNS, out)
    write_sums(HERE)


if __name__ == "__main__":
    main()
