"""Convert DeepBench's training results (results/train/DeepBench_NV_*.xlsx) into bench/data/kernels' common CSVs
(gemm.csv.gz, conv.csv.gz), and copy the workbooks byte for byte into xlsx/. The workbooks are read with the standard
library (an .xlsx is a zip of XML): no spreadsheet package is needed.

Run: python bench/data/kernels/deepbench/convert.py PATH-TO-A-CLONE-OF-baidu-research/DeepBench
"""

from __future__ import annotations

import io
import re
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import CONV_COLUMNS, GEMM_COLUMNS, git_bytes, seconds, write_csv, write_sums  # noqa: E402

COMMIT = "da81ba7820739e2e506dc27f382d15be5479f98f"
HERE = Path(__file__).resolve().parent
# workbook -> simfog's GPU name (its Specs sheet names the GPU and the machine)
WORKBOOKS = {"DeepBench_NV_V100.xlsx": "v100", "DeepBench_NV_P100.xlsx": "p100", "DeepBench_NV_T4.xlsx": "t4",
             "DeepBench_NV_1080Ti.xlsx": "gtx-1080-ti", "DeepBench_NV_M40.xlsx": "m40",
             "DeepBench_NV_TitanX.xlsx": "titan-x-maxwell", "DeepBench_NV_TitanX_Pascal.xlsx": "titan-x-pascal",
             "DeepBench_NV_TitanXp.xlsx": "titan-xp"}
NS = {"m": "http://schemas.openxmlformats.org/spreadsheetml/2006/main"}
REL = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"


def sheets(data: bytes) -> dict[str, list[dict[str, str]]]:
    """{sheet name: rows, each {column letter: text}} of an .xlsx file."""
    z = zipfile.ZipFile(io.BytesIO(data))
    strings = []
    if "xl/sharedStrings.xml" in z.namelist():
        root = ET.fromstring(z.read("xl/sharedStrings.xml"))
        strings = ["".join(t.text or "" for t in si.iter(f"{{{NS['m']}}}t")) for si in root.findall("m:si", NS)]
    targets = {r.get("Id"): r.get("Target") for r in ET.fromstring(z.read("xl/_rels/workbook.xml.rels"))}
    out = {}
    for sheet in ET.fromstring(z.read("xl/workbook.xml")).find("m:sheets", NS):
        root = ET.fromstring(z.read("xl/" + targets[sheet.get(REL)].removeprefix("/xl/")))
        rows = []
        for row in root.find("m:sheetData", NS):
            cells = {}
            for c in row:
                v, text = c.find("m:v", NS), None
                if v is not None:
                    text = strings[int(v.text)] if c.get("t") == "s" else v.text
                elif c.find("m:is", NS) is not None:
                    text = "".join(t.text or "" for t in c.find("m:is", NS).iter(f"{{{NS['m']}}}t"))
                if text not in (None, ""):
                    cells[re.sub(r"\d", "", c.get("r"))] = text.strip()
            rows.append(cells)
        out[sheet.get("name")] = rows
    return out


def number(text: str | None) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def sections(rows: list[dict]) -> dict[str, list[dict]]:
    """{"gemm": [...], "conv": [...]}: the rows of the GEMM and convolution tables, each {header: text}."""
    out, current, header = {"gemm": [], "conv": []}, None, {}
    for cells in rows:
        first = cells.get("A", "")
        if first:
            current = {"Dense Matrix Multiplication": "gemm", "Convolution": "conv"}.get(first)
            header = {col: text for col, text in cells.items() if col != "A"} if current == "gemm" else {}
            continue
        if current == "conv" and not header and "C" in cells and not number(cells.get("C")):
            header = dict(cells)
            continue
        if current and header and number(cells.get("C")) is not None:
            out[current].append({key(header[col]): text for col, text in cells.items() if col in header})
    return out


def key(header: str) -> str:
    """A column header as looked up: "R (Filter height)" and "R" -> "r", "Horizontal Stride" -> "horizontal stride",
    "Time (msec)" -> "time" (the workbooks spell their headers in several ways)."""
    return re.sub(r"\s*\(.*\)", "", header).strip().lower()


def convert(name: str, gpu: str, data: bytes) -> tuple[list[dict], list[dict]]:
    gemm, conv = [], []
    for sheet, rows in sheets(data).items():
        s = sheet.lower()
        if "spec" in s or "psuedo" in s or "pseudo" in s:
            continue  # the P100's "pseudo FP16" (FP16 storage, FP32 math) is left out
        precision = "fp16" if "fp16" in s else "fp32"
        tables = sections(rows)
        for r in tables["gemm"]:
            t = number(r.get("time"))
            if t is None:
                continue
            layout = (r.get("a transpose", "N") + r.get("b transpose", "N")).lower()
            gemm.append({"source": "deepbench", "set": sheet, "gpu": gpu, "precision": precision, "batch": 1,
                         "m": int(float(r["m"])), "n": int(float(r["n"])), "k": int(float(r["k"])), "layout": layout,
                         "bias": 0, "time_s": seconds(t), "kernel": ""})
        for r in tables["conv"]:
            base = {"source": "deepbench", "set": sheet, "gpu": gpu, "precision": precision,
                    **{x: int(float(r[x])) for x in ("n", "c", "h", "w", "k", "r", "s", "pad_h", "pad_w")},
                    "stride_h": int(float(r["vertical stride"])), "stride_w": int(float(r["horizontal stride"])),
                    "dilation": 1, "groups": 1, "algorithm": r.get("forward algorithm", "")}
            for phase, column in (("fwd", "forward"), ("dgrad", "wrt inputs"), ("wgrad", "wrt parameters")):
                t = number(r.get(column))
                if t is not None:
                    conv.append({**base, "pass": phase, "time_s": seconds(t),
                                 "algorithm": base["algorithm"] if phase == "fwd" else ""})
    return gemm, conv


def main() -> None:
    repo = sys.argv[1]
    (HERE / "xlsx").mkdir(exist_ok=True)
    gemm, conv = [], []
    for name, gpu in WORKBOOKS.items():
        data = git_bytes(repo, COMMIT, f"results/train/{name}")
        (HERE / "xlsx" / name).write_bytes(data)
        g, c = convert(name, gpu, data)
        gemm += g
        conv += c
    write_csv(HERE / "gemm.csv.gz", GEMM_COLUMNS, gemm)
    write_csv(HERE / "conv.csv.gz", CONV_COLUMNS, conv)
    write_sums(HERE)


if __name__ == "__main__":
    main()
