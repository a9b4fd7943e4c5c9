"""What the converters of bench/data/kernels/<source>/convert.py share: reading a file of a source repository at a
pinned commit (from a clone or a bare mirror: `git show COMMIT:PATH`), the common CSV columns, the precision a kernel
name shows, and writing CSVs and SHA256SUMS."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import re
import subprocess
from pathlib import Path

GEMM_COLUMNS = ("source", "set", "gpu", "precision", "batch", "m", "n", "k", "layout", "bias", "time_s", "kernel")
CONV_COLUMNS = ("source", "set", "gpu", "precision", "pass", "n", "c", "h", "w", "k", "r", "s", "stride_h",
                "stride_w", "pad_h", "pad_w", "dilation", "groups", "time_s", "algorithm")
MEMORY_COLUMNS = ("source", "set", "gpu", "precision", "op", "kind", "rows", "cols", "time_s", "kernel")
STEP_COLUMNS = ("source", "gpu", "precision", "model", "batch", "phase", "time_s", "note")


def git_bytes(repo: str | Path, commit: str, path: str) -> bytes:
    """The bytes of `path` at `commit` in the git repository (work tree or bare) at `repo`."""
    return subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True,
                          capture_output=True).stdout


def git_text(repo, commit: str, path: str) -> str:
    return git_bytes(repo, commit, path).decode()


def git_files(repo, commit: str, folder: str) -> list[str]:
    """Paths of the files under `folder` at `commit`."""
    out = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--name-only", commit, folder], check=True,
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line]


def read_csv(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def load(path: Path) -> list[dict]:
    """The rows of a CSV written by `write_csv` (gzipped or not)."""
    data = path.read_bytes()
    return read_csv((gzip.decompress(data) if path.suffix == ".gz" else data).decode())


def precision_of_kernel(name: str) -> str:
    """The arithmetic a CUDA kernel's name shows: "fp16" (h884/h1688/h16816, f16 inputs), "bf16", "tf32" (s1688,
    s16816, tf32 in xmma names), else "fp32" (sgemm, scudnn, SIMT kernels)."""
    n = name.lower()
    if "bf16" in n:
        return "bf16"
    if re.search(r"h884|h1688|h16816|f16f16|fp16|_half|hgemm|s884", n):
        return "fp16"
    if re.search(r"tf32|s1688|s16816", n):
        return "tf32"
    return "fp32"


def short_kernel(name: str) -> str:
    """A kernel's name without its template arguments and parameters, at most 80 characters."""
    n = re.sub(r"^void\s+", "", name.strip())
    n = n.split("(")[0].split("<")[0]
    return n[:80]


def write_csv(path: Path, columns, rows: list[dict]) -> None:
    """`rows` as CSV at `path`; gzipped (with no name or time in its header, so the bytes are reproducible) when
    the path ends in .gz."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c, "") for c in columns})
    data = buf.getvalue().encode()
    if path.suffix == ".gz":
        with path.open("wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as z:
            z.write(data)
    else:
        path.write_bytes(data)
    print(f"wrote {path} ({len(rows)} rows)")


def write_sums(folder: Path) -> None:
    """SHA256SUMS of every data file under `folder` (not itself, the scripts or the notes), sorted, in `sha256sum -c`
    format."""
    lines = []
    for p in sorted(x for x in folder.rglob("*") if x.is_file() and x.name != "SHA256SUMS"
                    and x.suffix not in {".py", ".md", ".pyc"} and "__pycache__" not in x.parts):
        lines.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(folder).as_posix()}")
    (folder / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def seconds(ms: str) -> str:
    """A time in milliseconds (text) as seconds, 6 significant digits."""
    return f"{float(ms) * 1e-3:.6g}"
