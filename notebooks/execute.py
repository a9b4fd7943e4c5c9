"""Re-execute the committed notebooks: full settings in place, and their small-mode outputs as a golden.

    python notebooks/execute.py                       # every notebook
    python notebooks/execute.py 01-mgwfbp-scaling     # some

For each notebook: (1) run it with SIMFOG_NB_SMALL=1 (figures to a temporary folder) and write what that run
computes, its `RESULT {json}` records and its Markdown texts, to small/<name>.json; (2) run it with full settings
and save it in place with its outputs, figures to figures/. Both record the SHA-256 of the notebook's code cells,
so tests/test_notebooks.py can tell whether the committed outputs and the golden come from the code cells as they
are now, and whether a fresh small-mode run still computes the golden.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOKS = sorted(p.name for p in HERE.glob("0*.ipynb"))


def code_sha256(nb) -> str:
    """What the outputs were computed from: the code cells' sources, in order."""
    code = "\n\0".join(c.source for c in nb.cells if c.cell_type == "code")
    return hashlib.sha256(code.encode()).hexdigest()


def execute(name: str, *, small: bool, figures: Path | None = None, kernel_name: str = "python3",
            timeout_s: int = 1200):
    """Run notebook `name` in a fresh kernel from notebooks/, figures to `figures` (None: the notebook's default,
    notebooks/figures); returns the executed notebook (not saved)."""
    import nbclient
    import nbformat

    nb = nbformat.read(HERE / name, as_version=4)
    saved = {k: os.environ.pop(k, None) for k in ("SIMFOG_NB_SMALL", "SIMFOG_NB_OUT")}
    if small:
        os.environ["SIMFOG_NB_SMALL"] = "1"
    if figures is not None:
        os.environ["SIMFOG_NB_OUT"] = str(figures)
    try:
        nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name=kernel_name, record_timing=False,
                                resources={"metadata": {"path": str(HERE)}}).execute()
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
    return nb


def computed_outputs(nb) -> dict:
    """What a run computes and can be compared across runs: its RESULT records (stdout lines `RESULT {json}`) and
    its Markdown texts (the prose made from the runs). Tables, figures and paths are left out: their rendering
    depends on library versions and folders, not on the numbers."""
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    stdout = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    return {"results": [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines()
                        if line.startswith("RESULT ")],
            "markdown": [o.data["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]}


def golden_path(name: str) -> Path:
    return HERE / "small" / f"{Path(name).stem}.json"


def main(names: list[str]) -> int:
    import nbformat

    for name in names or NOTEBOOKS:
        name = name if name.endswith(".ipynb") else f"{name}.ipynb"
        with tempfile.TemporaryDirectory() as tmp:
            small = execute(name, small=True, figures=Path(tmp))
        golden = {"code_sha256": code_sha256(small), **computed_outputs(small)}
        golden_path(name).parent.mkdir(exist_ok=True)
        golden_path(name).write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        full = execute(name, small=False)
        full.metadata["simfog"] = {"code_sha256": code_sha256(full)}
        nbformat.write(full, HERE / name)
        print(f"{name}: executed; golden {golden_path(name).relative_to(HERE)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
