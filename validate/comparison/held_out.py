"""Each validation row's interval from the errors of the OTHER configurations measured on the same host.

A row's interval from its inputs (simfog.run_bands: the trace's spread, the link calibration's residuals)
holds parts nothing measured well enough (six microbenchmark sizes per link class cannot bound a new point at
90 %), so it is wide. The rows themselves measure the model's whole error on this host. For each row, its held-out
interval is the prediction x exp(±q), q the conformal half-width (simfog.bands.conformal_quantile) of
|ln(measured / predicted)| over the rows of every other configuration kind (training algorithm with its settings, and
model; rows of several jobs on one fabric are kinds of their own), never its own: each row is judged by an interval
fitted without any row like it (leave one kind out). With too few other rows for the level the row has none.

The same scores over every row give what the next configuration on this host may expect (`host_half_width`).
Pure: works on rows (a run's, or a CSV's read back), so a bench CSV can be re-judged later.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from simfog.bands import DEFAULT_LEVEL, conformal_quantile


def kind_of(row: Mapping) -> tuple:
    """The configuration kind a row is held out with: its algorithm (with its settings), merge policy's family
    aside, model, and whether it ran beside other jobs."""
    return (_text(row.get("algorithm")) or "allreduce", _text(row.get("model")), bool(_text(row.get("job"))))


def _text(x: object) -> str:
    """A cell as text: '' for None, '' and NaN (how a CSV read by pandas gives an empty cell)."""
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


def score(row: Mapping) -> float | None:
    """|ln(measured / predicted)| of the row's steady-state iteration (None for a failed or incomplete row)."""
    if _text(row.get("error")):
        return None
    try:
        m, p = float(row["measured_iteration_s"]), float(row["predicted_iteration_s"])
    except (KeyError, TypeError, ValueError):
        return None
    return abs(math.log(m / p)) if m > 0 and p > 0 and math.isfinite(m) and math.isfinite(p) else None


def held_out_keys(rows: Sequence[Mapping], level: float = DEFAULT_LEVEL) -> list[dict]:
    """Per row (in order): held_out_lo_s, held_out_hi_s (empty where the row failed or the other kinds' rows are too
    few for `level`), inside_held_out, held_out_rows (how many rows the half-width came from)."""
    scored = [(kind_of(r), score(r)) for r in rows]
    out = []
    for r, (kind, s) in zip(rows, scored, strict=True):
        others = [x for k, x in scored if x is not None and k != kind]
        q = conformal_quantile(others, level) if others else None
        if s is None or q is None:
            out.append({"held_out_lo_s": "", "held_out_hi_s": "", "inside_held_out": "", "held_out_rows": len(others)})
            continue
        p = float(r["predicted_iteration_s"])
        out.append({"held_out_lo_s": p * math.exp(-q), "held_out_hi_s": p * math.exp(q),
                    "inside_held_out": bool(s <= q), "held_out_rows": len(others)})
    return out


def host_half_width(rows: Sequence[Mapping], level: float = DEFAULT_LEVEL) -> float | None:
    """The conformal half-width (ln) of every row's error: how far the next configuration on this host may be off
    at `level` (None: too few rows)."""
    scores = [s for s in map(score, rows) if s is not None]
    return conformal_quantile(scores, level) if scores else None


def held_out_line(rows: Sequence[Mapping], level: float = DEFAULT_LEVEL) -> str:
    """'held out by configuration kind: ...' coverage and median relative half-width of the rows' held-out
    intervals, and the host's half-width from all rows ('' when no row has one)."""
    keys = [(r, k) for r, k in zip(rows, held_out_keys(rows, level), strict=True) if k["inside_held_out"] != ""]
    if not keys:
        return ""
    inside = sum(k["inside_held_out"] for _, k in keys)
    median = statistics.median((k["held_out_hi_s"] - k["held_out_lo_s"]) / 2 / float(r["predicted_iteration_s"])
                               for r, k in keys)
    q = host_half_width(rows, level)
    host = (f"; every row's error gives the next configuration here a relative half-width of {math.sinh(q):.1%}"
            if q is not None else "")
    return (f"  held out by configuration kind: {inside} of {len(keys)} rows inside their {100 * level:g} % "
            f"interval ({inside / len(keys):.0%}), median relative half-width {median:.1%}{host}")
