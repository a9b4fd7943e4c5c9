"""`simfog validate ... --report OUT.html`: one self-contained HTML page a person reads.

What it shows, per validation (a single experiment or the bench's groups):

- a table of every configuration: measured iteration time ± its spread over the measured iterations, predicted,
  signed error, buckets (and whether both sides ran the same ones), the beyond-the-wire inputs' source, the
  host's load and packets the shapers dropped;
- measured against predicted with error bars (one standard deviation of the measured steady-state iterations);
- for up to MAX_TIMELINES configurations (the largest |error| first) the two timelines side by side: one steady
  iteration, a lane per rank (compute above, communication below), buckets named on the communication lanes;
  only those: the page stays small enough to mail (a timeline's intervals are drawn one path per lane and kind,
  text as text rather than glyph outlines);
- the calibration of each emulated cluster: fitted latency and bandwidth per link class and every
  microbenchmark's residual.

Everything is inline (SVG figures drawn by matplotlib, CSS in a <style> element, no script, no external file), so
the page can be mailed or attached to an issue. Written atomically.
"""

from __future__ import annotations

import datetime
import html
import io
import math
import platform
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from simfog import units
from validate.comparison.compare import _finite

MAX_TIMELINES = 10
MAX_LANES = 8  # ranks drawn per timeline (the first ones)
KIND_COLORS = {"forward": "#4c72b0", "backward": "#55a868", "optimizer": "#8172b2", "comm": "#dd8452",
               "wait": "#c44e52", "pack": "#937860", "unpack": "#937860", "overhead": "#8c8c8c"}
_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:0.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f0f0f0} td.l,th.l{text-align:left}
.bad{color:#b00020;font-weight:600} .note{color:#555;font-size:13px}
figure{margin:0.5em 0 1.5em} figcaption{font-size:13px;color:#444}
.pair{display:flex;gap:1em;flex-wrap:wrap}
"""


def write_report(path, groups: Sequence, *, title: str = "simfog validation", note: str = "") -> Path:
    """Write the page for `groups` (validate.run.GroupRun, or objects with its `validations`, `calibration`,
    `emulated`, `note` and `rows`) to `path`. Returns the path."""
    from simfog.files import atomic_open

    rows = [r for g in groups for r in g.rows]
    validations = [v for g in groups for v in g.validations]
    body = [f"<h1>{_e(title)}</h1>",
            f"<p class=note>Written {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on "
            f"{_e(platform.node())}. Error = (predicted − measured) / measured of the steady-state iteration time "
            f"(validate.comparison.compare). {_e(note)}</p>",
            _summary(rows), _hosts(rows), "<h2>Configurations</h2>", _table(rows),
            "<h2>Measured against predicted</h2>", _figure(_error_figure(rows),
                                                            "Iteration time per configuration: measured (mean of the "
                                                            "steady-state iterations, bar = one standard deviation) "
                                                            "and predicted.")]
    body += _timelines(validations)
    body += _calibrations(groups)
    page = (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>")
    with atomic_open(path) as f:
        f.write(page)
    return Path(path)


def _e(x) -> str:
    return html.escape(str(x))


def _summary(rows) -> str:
    from validate.comparison.compare import error_stats

    s = error_stats(rows)
    if not s["configurations"]:
        return f"<p class=bad>None of {len(rows)} configurations ran.</p>"
    failed = sum(1 for r in rows if r.get("error"))
    return (f"<p><b>{len(rows)} configurations</b>, {s['configurations']} measured: median |error| "
            f"{s['median_abs_rel_error']:.1%}, worst {s['worst_abs_rel_error']:.1%} ({_e(s['worst_id'])})"
            + (f"; <span class=bad>{failed} failed</span>" if failed else "") + "</p>")


COLUMNS = (("id", "configuration", "l"), ("buckets", "buckets", ""), ("buckets_match", "same buckets", ""),
           ("measured_iteration_s", "measured", ""), ("measured_iteration_std_s", "± std", ""),
           ("predicted_iteration_s", "predicted", ""), ("rel_error", "error", ""),
           ("bucket_copy_Bps", "copy bandwidth", ""), ("overheads_source", "from", "l"), ("load_average", "load", ""),
           ("host_steal", "steal", ""), ("host_limited", "host", "l"), ("dropped_packets", "drops", ""),
           ("error", "failure", "l"))
LEGEND = ("measured: mean steady-state iteration of the real run (± its standard deviation over iterations); "
          "predicted: simfog's, from the calibration made just before; error: (predicted − measured) / measured; "
          "same buckets: whether both sides ran the same buckets; copy bandwidth and from: the beyond-the-wire input "
          "the prediction used and where it came from; load: the 1-minute load average before the row; steal: the "
          "share of CPU time a hypervisor took while the row ran; host: HOST-LIMITED where the CPUs, not the emulated "
          "network, limited the run (validate.cluster.hostload; such rows are reported apart from the bench's "
          "statistics); drops: packets the shapers dropped.")


def _cell(key: str, value) -> str:
    if key in ("measured_iteration_s", "measured_iteration_std_s", "predicted_iteration_s"):
        return units.format_time(value) if _finite(value) else ""
    if key == "bucket_copy_Bps":
        return units.format_bandwidth(value) if _finite(value) and value > 0 else ("free" if value == 0 else "")
    if key == "rel_error":
        return f"{value:+.1%}" if _finite(value) else ""
    if key == "overheads_source":  # the source without its method note (the CSV keeps it whole)
        text = str(value or "")
        cut = text.find(" (", max(text.find(" by "), 0))  # "measured on DEVICE by WHOM (how ...)"
        return text[:cut] if cut > 0 else text
    if key == "load_average":
        return f"{value:.2f}" if _finite(value) else ""
    if key == "host_steal":
        return f"{value:.1%}" if _finite(value) else ""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _table(rows) -> str:
    from validate.comparison.compare import host_limited

    head = "".join(f"<th class={c}>{_e(h)}</th>" if c else f"<th>{_e(h)}</th>" for _, h, c in COLUMNS)
    out = [f"<p class=note>{_e(LEGEND)}</p><table id=configurations><thead><tr>{head}</tr></thead><tbody>"]
    for r in rows:
        bad = _finite(r.get("rel_error")) and abs(r["rel_error"]) > 0.15 or bool(r.get("error"))
        shown = {**r, "host_limited": "HOST-LIMITED" if host_limited(r) else ""}
        cells = "".join(f"<td class='{c}{' bad' if bad and k in ('rel_error', 'error') else ''}'>"
                        f"{_e(_cell(k, shown.get(k)))}</td>" for k, _, c in COLUMNS)
        out.append(f"<tr>{cells}</tr>")
    return "".join(out) + "</tbody></table>"


def _hosts(rows) -> str:
    """The machines the rows ran on (validate.cluster.fingerprint), one line each."""
    seen = []
    for r in rows:
        if r.get("host_cpu_model") and _finite(r.get("host_microbenchmark_s")):
            line = (f"{r['host_cpu_model']}, {r.get('host_cores', '?')} cores, kernel {r.get('host_kernel', '?')}, "
                    f"fixed single-core microbenchmark {r['host_microbenchmark_s'] * 1e3:.1f} ms")
            if line not in seen:
                seen.append(line)
    return "".join(f"<p class=note>Host: {_e(h)}</p>" for h in seen)


def _svg(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    # text as <text>, not one path per glyph: a third of the page's size went to letters drawn as outlines
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]  # inline: no XML declaration or DOCTYPE inside HTML


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{_e(caption)}</figcaption></figure>"


def _error_figure(rows) -> str:
    from matplotlib.figure import Figure

    from validate.comparison.compare import host_limited

    ok = [r for r in rows if _finite(r.get("measured_iteration_s")) and _finite(r.get("predicted_iteration_s"))]
    fig = Figure(figsize=(8, 0.6 + 0.28 * max(len(ok), 1)))
    ax = fig.add_subplot()
    y = np.arange(len(ok))[::-1]
    if ok:
        m = np.array([r["measured_iteration_s"] for r in ok]) * 1e3
        sd = np.array([r.get("measured_iteration_std_s") or 0.0 for r in ok]) * 1e3
        p = np.array([r["predicted_iteration_s"] for r in ok]) * 1e3
        ax.errorbar(m, y, xerr=sd, fmt="o", color="#222", ms=4, capsize=3, label="measured ± std")
        ax.plot(p, y, "D", color="#dd8452", ms=5, ls="none", label="predicted")
        ax.set_yticks(y, [str(r["id"]) + (" (host-limited)" if host_limited(r) else "") for r in ok], fontsize=7)
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("iteration time (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    return _svg(fig)


def _steady(result) -> int:
    its = sorted(set(result.intervals()["iteration"]))
    return its[1] if len(its) > 1 else its[0]


def _timeline_axes(ax, result, title: str) -> None:
    df = result.intervals()
    it = _steady(result)
    df = df[(df.iteration == it) & (df["rank"] < MAX_LANES)]
    t0 = df.start_s.min()
    span = max(df.end_s.max() - t0, 1e-12) * 1e3
    ranks = sorted(set(df["rank"]))
    for lane, rank in enumerate(ranks):
        base = (len(ranks) - 1 - lane) * 2.2
        bars: dict[tuple[str, float], list] = {}  # one path per lane and kind, not one per interval
        for row in df[df["rank"] == rank].itertuples():
            comm = row.kind in ("comm", "wait", "pack", "unpack", "overhead")
            y = base + (0.0 if comm else 1.05)
            s, w = (row.start_s - t0) * 1e3, (row.end_s - row.start_s) * 1e3
            bars.setdefault((row.kind, y), []).append((s, max(w, 1e-6)))
            if comm and w > 0.06 * span:  # name the buckets that are wide enough to read
                ax.text(s + w / 2, y + 0.47, str(row.name), ha="center", va="center", fontsize=5, clip_on=True)
        for (kind, y), spans in bars.items():
            ax.add_patch(_rectangles(spans, y, 0.95, KIND_COLORS.get(kind, "#999")))
    ax.set_yticks([(len(ranks) - 1 - i) * 2.2 + 1.0 for i in range(len(ranks))], [f"rank {r}" for r in ranks],
                  fontsize=7)
    ax.set_xlim(0, span * 1.01)  # patches added by hand do not move the limits
    ax.set_ylim(-0.15, (len(ranks) - 1) * 2.2 + 2.15)
    ax.set_xlabel(f"ms from the start of iteration {it}")
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)


def _rectangles(spans, y: float, height: float, color: str):
    """One patch (one SVG path) of the rectangles (start, width) x (y, height): a path per rectangle made the
    timelines most of the page's bytes."""
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path as MplPath

    verts, codes = [], []
    for s, w in spans:
        verts += [(s, y), (s + w, y), (s + w, y + height), (s, y + height), (s, y)]
        codes += [MplPath.MOVETO, MplPath.LINETO, MplPath.LINETO, MplPath.LINETO, MplPath.CLOSEPOLY]
    return PathPatch(MplPath(verts, codes), facecolor=color, edgecolor="white", linewidth=0.3)


def _timeline_figure(v) -> str:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(12, 1.2 + 0.55 * min(v.experiment.ranks, MAX_LANES)))
    left, right = fig.subplots(1, 2, sharex=True)
    _timeline_axes(left, v.measured, "measured")
    _timeline_axes(right, v.predicted, "predicted")
    kinds = ("forward", "backward", "optimizer", "comm", "wait")
    fig.legend(handles=[Patch(color=KIND_COLORS[k], label=k) for k in kinds], loc="upper center", ncol=len(kinds),
               fontsize=7, bbox_to_anchor=(0.5, 1.02))
    return _svg(fig)


def _timelines(validations) -> list[str]:
    from validate.comparison.compare import host_limited

    both = [v for v in validations if v.measured is not None and v.predicted is not None]
    both.sort(key=lambda v: -abs(v.row.get("rel_error") or 0.0) if _finite(v.row.get("rel_error")) else 0.0)
    if not both:
        return []
    out = ["<h2>Timelines</h2>",
           f"<p class=note>One steady-state iteration per side, the first {MAX_LANES} ranks; compute on the upper "
           f"half of each lane, communication (buckets named) on the lower."
           + (f" The {MAX_TIMELINES} configurations with the largest |error| of {len(both)}." if len(both) >
              MAX_TIMELINES else "") + "</p>"]
    for v in both[:MAX_TIMELINES]:
        err = v.row.get("rel_error")
        caption = f"{v.id}: error {err:+.1%}" if _finite(err) else str(v.id)
        if host_limited(v.row):
            caption += " (host-limited: the CPUs, not the emulated network, limited the run)"
        out.append(_figure(_timeline_figure(v), caption))
    return out


def _calibrations(groups) -> list[str]:
    out = []
    for g in groups:
        cal = getattr(g, "calibration", None)
        if cal is None:
            continue
        if not out:
            out.append("<h2>Calibration</h2>")
        ids = ", ".join(str(v.id) for v in g.validations[:4]) + (" ..." if len(g.validations) > 4 else "")
        fits = "".join(f"<tr><td class=l>{_e(c)}</td><td>{units.format_time(f.latency_s)}</td>"
                       f"<td>{_e(units.format_bandwidth(f.bandwidth_Bps))}</td></tr>" for c, f in cal.fits.items())
        out.append(f"<h3>Cluster of {_e(ids)}{'' if g.emulated else ' (NOT emulated: loopback)'}</h3>"
                   f"<table class=fits><thead><tr><th class=l>link class</th><th>latency</th><th>bandwidth</th>"
                   f"</tr></thead><tbody>{fits}</tbody></table>")
        res = cal.residuals
        out.append(_figure(_residual_figure(res), "Calibration residuals: (fitted − measured) / measured per "
                                                  "microbenchmark, against message size."))
        cells = "".join(f"<tr><td class=l>{_e(r.link_class)}</td><td class=l>{_e(r.collective)}</td>"
                        f"<td>{r.ranks}</td><td>{_e(units.format_bytes(r.bytes))}</td>"
                        f"<td>{units.format_time(r.measured_s)}</td><td>{units.format_time(r.predicted_s)}</td>"
                        f"<td>{r.rel_error:+.1%}</td></tr>" for r in res.itertuples())
        out.append("<table class=residuals><thead><tr><th class=l>class</th><th class=l>collective</th>"
                   "<th>ranks</th><th>size</th><th>measured</th><th>fitted</th><th>error</th></tr></thead>"
                   f"<tbody>{cells}</tbody></table>")
    return out


def _residual_figure(res) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3))
    ax = fig.add_subplot()
    for cls, part in res.groupby("link_class"):
        ax.plot(part["bytes"], part["rel_error"] * 100, "o-", ms=4, label=str(cls))
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("residual (%)")
    ax.grid(True, alpha=0.3)
    if len(res):
        ax.legend(fontsize=8)
    return _svg(fig)
