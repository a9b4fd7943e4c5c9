"""Figures a reader trusts, read from the figure objects (no image goldens): lines join points in the x axis'
order, axes start at zero (iteration time, cost) or say they do not (a log scale in the label), efficiency spans
0-100 %, and titles name the model, the device, the network (file) and the collective."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simfog import experiment, nccl, network_file, plot
from simfog.plan import PlanResult
from simfog.titles import run_title
from simfog.tune import tune
from simfog.tune_framework import tune_framework

from .conftest import make_experiment, make_trace

TRACE = make_trace([0.001] * 4, [0.001] * 4, [250_000] * 4)


def test_tune_plots_start_at_zero_so_small_differences_look_small():
    # the y axis from zero: differences of a fraction of a percent look as small as they are
    exp = make_experiment(TRACE, alpha=1e-4, beta=1e-11)
    ax = plot.tune_figure(tune(exp, points=5, refine=0)).axes[0]
    assert ax.get_ylim()[0] == 0 and ax.get_ylabel() == "iteration time (ms)"
    ax = plot.framework_tune_figure(tune_framework(exp, "ddp")).axes[0]
    assert ax.get_ylim()[0] == 0
    top = max(np.max(line.get_ydata()) for line in ax.get_lines())
    assert ax.get_ylim()[1] >= top


def _plan_result(target=np.nan):
    # evaluation order 8, 16, 1, 2, 4 GPUs (the doubling search, then the counts between): the line must not zig-zag
    gpus = [8, 16, 1, 2, 4]
    df = pd.DataFrame({"option": "a", "gpus": gpus, "nodes": [1, 2, 1, 1, 1], "collective": "ring", "merge": "ddp",
                       "samples_per_s": [80.0 * g for g in gpus], "cost_per_hour": [1.48 + g / 1000 for g in gpus],
                       "error": ""})
    return PlanResult(df, None, target, "USD", None, "toy plan")


def test_plan_lines_join_points_in_axis_order_on_a_cost_axis_from_zero():
    ax = plot.plan_figure(_plan_result()).axes[0]
    line = next(line for line in ax.get_lines() if line.get_label().startswith("a:"))
    xs = np.asarray(line.get_xdata())
    assert list(xs) == sorted(xs) == [80, 160, 320, 640, 1280]
    # costs from 1.481 to 1.496 USD: a linear axis from zero, not 1.480-1.496 magnified
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    assert "log" not in ax.get_ylabel()
    # no target, no target line; with one, a vertical line at it
    assert not any(line.get_label().startswith("target") for line in ax.get_lines())
    ax = plot.plan_figure(_plan_result(target=500.0)).axes[0]
    assert any(line.get_label().startswith("target 500") for line in ax.get_lines())


def test_curve_efficiency_is_0_to_100_and_throughput_says_log():
    df = pd.DataFrame({"ranks": [4, 8, 2], "merge": "ddp", "collective": "ring",
                       "samples_per_s": [300.0, 500.0, 160.0], "scaling_efficiency": [0.9375, 0.78125, 1.0],
                       "error": ""})
    fig = plot.curve_figure(df.sort_values("ranks"), "t")
    ax_t, ax_e = fig.axes
    assert ax_e.get_ylim() == (0, 100) and ax_e.get_ylabel() == "scaling efficiency (%)"
    assert ax_t.get_yscale() == "log" and "log scale" in ax_t.get_ylabel()
    line = ax_t.get_lines()[0]
    assert list(line.get_xdata()) == [2, 4, 8]


def test_titles_name_model_device_network_file_and_collective(tmp_path):
    make_trace([0.02, 0.03], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    # a fitted inter-node bus bandwidth of 129.5 GB/s: the title names the file, not "NIC 1036 Gbit/s"
    network_file.save(tmp_path / "a100-ib.toml", nccl.NcclNetwork(230e9, 129.5e9, version="2.21.5"))
    (tmp_path / "e.toml").write_text('[workload]\ntrace = "t.json"\n[cluster]\nnodes = 2\ngpus_per_node = 8\n'
                                     'network = "a100-ib.toml"\n[comm]\ncollective = "nccl"\n')
    title = run_title(experiment.load(tmp_path / "e.toml"))
    assert title.startswith("toy (batch 8/rank) on ")
    assert "network a100-ib.toml" in title and "Gbit/s" not in title and "nccl" in title
    assert title.endswith("; samples layer times of trace t.json")
    assert "16 ranks (2 x 8)" in title
    own = run_title(make_experiment(TRACE, collective="ring"), ranks=False)
    assert "NIC 10 Gbit/s" in own and "ring" in own and "2 per node" in own


def test_plan_and_curve_figures_name_the_trace_and_network_files(tmp_path):
    """A plan's networks are its options': its figure names the trace, the catalogue and the network files the
    options use; a curve's names the trace and the network file of its experiment."""
    from simfog.plan import load_catalogue
    from simfog.pricing import plan_counts

    make_trace([0.02, 0.03], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    network_file.save(tmp_path / "a100-ib.toml", nccl.NcclNetwork(230e9, 129.5e9, version="2.21.5"))
    (tmp_path / "prices.toml").write_text(
        'currency = "EUR"\n[[option]]\nname = "ib"\ngpus_per_node = 8\nmax_nodes = 4\nprice_per_gpu_hour = 1.0\n'
        'network = "a100-ib.toml"\n[[option]]\nname = "eth"\ngpus_per_node = 8\nmax_nodes = 4\n'
        'price_per_gpu_hour = 0.5\nintra_bandwidth = "100GB/s"\nnic_bandwidth = "25Gbit/s"\nnic_latency = "10us"\n')
    (tmp_path / "e.toml").write_text('[workload]\ntrace = "t.json"\n[cluster]\nnodes = 2\ngpus_per_node = 8\n'
                                     'network = "a100-ib.toml"\n[comm]\ncollective = "nccl"\n')
    exp = experiment.load(tmp_path / "e.toml")
    result = plan_counts(exp, load_catalogue(tmp_path / "prices.toml"), gpus=[8, 16])
    title = plot.plan_figure(result).axes[0].get_title()
    assert title == result.title
    assert title.startswith("toy (batch 8/GPU) on ") and (
        f" at GPUs 8, 16; {exp.workload.compute} layer times of trace t.json" in title)  # the experiment's mode
    assert title.endswith("; catalogue prices.toml (network files a100-ib.toml)")
    df = pd.DataFrame({"ranks": [8, 16], "merge": "ddp", "collective": "nccl", "samples_per_s": [300.0, 500.0],
                       "scaling_efficiency": [1.0, 0.9], "error": ""})
    title = plot.curve_figure(df, run_title(exp, collective="nccl", ranks=False))._suptitle.get_text()
    assert "of trace t.json" in title and "network a100-ib.toml" in title


def test_tune_figures_draw_where_the_defaults_lie_within_the_models_uncertainty():
    from matplotlib.container import ErrorbarContainer

    exp = make_experiment(TRACE, alpha=1e-4, beta=1e-11)
    result = tune(exp, points=5, refine=0)
    assert result.versus_defaults
    ax = plot.tune_figure(result).axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == len(result.versus_defaults)
    best = result.best_iteration_time_s * 1e3
    for bar, (policy, iv) in zip(bars, result.versus_defaults.items(), strict=True):
        assert np.asarray(bar.lines[0].get_ydata())[0] == result.baselines[policy] * 1e3
        caps = sorted(float(np.asarray(cap.get_ydata())[0]) for cap in bar.lines[1])
        assert caps == [best * iv.lo, best * iv.hi] or np.allclose(caps, [best * iv.lo, best * iv.hi])
    # alpha 10 ms, 10 ns/B: DDP's 25 MiB default is x1.138 (90 %: 1.072-1.179) the best bucket: a band there
    framework = tune_framework(make_experiment(TRACE, alpha=1e-2, beta=1e-8), "ddp", tolerance=0.01)
    iv, choice = framework.gain_interval, framework.choice["iteration_time_s"] * 1e3
    ax = plot.framework_tune_figure(framework).axes[0]
    span, = [p for p in ax.patches if p.get_label().startswith("default /")]
    assert np.allclose([span.get_y(), span.get_y() + span.get_height()], [choice * iv.lo, choice * iv.hi])
    # kept within the tolerance: nothing weighed, no band
    kept = tune_framework(make_experiment(TRACE, alpha=1e-3, beta=1e-9), "ddp", tolerance=0.01)
    ax = plot.framework_tune_figure(kept).axes[0]
    assert kept.gain_interval is None and not [p for p in ax.patches if p.get_label().startswith("default /")]


# --- read at a glance (issue 36, point 7): legends inside, bands drawn, points outside a band hollow ---

def _drawn(fig):
    """`fig` rendered with the Agg canvas, as `simfog.plot.save` writes it; returns its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _legend_inside_above_the_data(ax, renderer) -> None:
    """The legend lies within the axes, and every line's highest point below the legend's bottom edge."""
    legend, box = ax.get_legend(), ax.get_window_extent(renderer)
    lb = legend.get_window_extent(renderer)
    assert box.x0 <= lb.x0 and lb.x1 <= box.x1 and box.y0 <= lb.y0 and lb.y1 <= box.y1, (lb, box)
    bottom = ax.transData.inverted().transform((0, lb.y0))[1]
    top = max(np.nanmax(np.asarray(line.get_ydata(), dtype=float)) for line in ax.get_lines()
              if len(line.get_ydata()))
    assert top < bottom
    assert ax.get_ylim()[0] == 0  # raised for the legend, still from zero


def _span(ax, prefix: str) -> tuple[float, float]:
    """The x extent, in data coordinates, of the one shaded span whose label starts with `prefix`."""
    patch, = [p for p in ax.patches if p.get_label().startswith(prefix)]
    return patch.get_x(), patch.get_x() + patch.get_width()


def test_tune_figures_hold_their_legend_inside_and_show_the_tolerance():
    from simfog.tune_sharded import tune_sharded

    exp = make_experiment(TRACE, alpha=1e-4, beta=1e-11)
    result = tune(exp, points=5, refine=0)
    fig = plot.tune_figure(result)
    ax, = fig.axes
    _legend_inside_above_the_data(ax, _drawn(fig))
    # the thresholds within 1 % of the best, across the whole height
    assert np.allclose(_span(ax, "within 1 % of the best"), result.near_best_bytes)

    framework = tune_framework(make_experiment(TRACE, alpha=1e-2, beta=1e-8), "ddp", tolerance=0.01)
    fig = plot.framework_tune_figure(framework)
    ax, = fig.axes
    _legend_inside_above_the_data(ax, _drawn(fig))
    least = framework.best["iteration_time_s"] * 1e3
    band = next(p for p in ax.patches if p.get_label().startswith("within 1 % of the best"))
    assert np.allclose([band.get_y(), band.get_y() + band.get_height()], [least, least * 1.01])
    assert band.get_edgecolor()[3] > 0 and band.get_linewidth() > 0  # its edges drawn: 1 % of the axis is a hair
    assert np.allclose(_span(ax, "widest range within it"), framework.plateau[framework.knobs[0].name])

    fig = plot.sharded_tune_figure(tune_sharded(make_experiment(TRACE, algorithm="fsdp", alpha=1e-3, beta=1e-9)))
    _legend_inside_above_the_data(fig.axes[0], _drawn(fig))


def _confident_plan():
    gpus = [8, 16, 32]
    df = pd.DataFrame({"option": "a", "gpus": gpus, "nodes": [1, 2, 4], "collective": "ring", "merge": "ddp",
                       "samples_per_s": [800.0, 1500.0, 2800.0], "samples_per_s_lo": [600.0, 1100.0, 2000.0],
                       "samples_per_s_hi": [900.0, 1700.0, 3300.0], "cost_per_hour": [8.0, 16.0, 32.0],
                       "meets_target": [False, False, True], "error": ""})
    return PlanResult(df, df.iloc[2].to_dict(), 1900.0, "USD", None, "toy plan", {"confidence": 0.9})


def test_a_confident_plan_draws_its_bands_and_its_points_reached_with_that_confidence():
    from matplotlib.container import ErrorbarContainer

    result = _confident_plan()
    fig = plot.plan_figure(result)
    ax, = fig.axes
    _drawn(fig)
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer) and c.lines[2]]
    spans = [seg[:, 0] for c in bars for seg in c.lines[2][0].get_segments()]
    assert sorted(map(tuple, spans)) == [(600.0, 900.0), (1100.0, 1700.0), (2000.0, 3300.0)]  # lo..hi, each point
    sure = [line for line in ax.get_lines() if line.get_marker() == "<" and len(line.get_xdata())]
    assert [list(line.get_xdata()) for line in sure] == [[600.0, 1100.0, 2000.0], [2000.0]]
    assert all(line.get_markerfacecolor() == "none" for line in sure)  # hollow: a bound, not a prediction
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "80 % prediction interval" in labels and any(t.startswith("90 % sure") for t in labels)
    assert "its 90 % sure throughput: 2,000 samples/s" in labels
    plain = plot.plan_figure(_plan_result()).axes[0]  # no interval asked: none drawn
    assert not [c for c in plain.containers if isinstance(c, ErrorbarContainer)]


def test_published_points_are_filled_inside_their_band_and_hollow_outside():
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.figure import Figure

    gpus = np.array([16, 4, 8, 32])            # any order: drawn in x order
    ideal = 100.0 * gpus
    predicted = 0.9 * ideal
    lo, hi = 0.85 * ideal, 0.95 * ideal        # a ±5 % band: a hair on a log axis of throughput
    published = np.array([0.96, 0.9, 0.88, 0.7]) * ideal
    inside = (lo <= published) & (published <= hi)
    ax = Figure().add_subplot()
    plot.published_beside_band(ax, gpus, published, predicted, lo, hi, inside, color="tab:blue", ideal=ideal,
                               reading=0.01 * ideal)
    filled = [line for line in ax.get_lines() if line.get_label().endswith("inside the band")]
    hollow = [line for line in ax.get_lines() if line.get_label().endswith("outside the band")]
    assert len(filled) == len(hollow) == 1
    assert filled[0].get_markerfacecolor() == "black" and hollow[0].get_markerfacecolor() == "white"
    assert list(filled[0].get_xdata()) == [4, 8] and list(hollow[0].get_xdata()) == [16, 32]
    assert np.allclose(hollow[0].get_ydata(), [0.96, 0.7])  # the share of linear scaling
    band, = [c for c in ax.collections if isinstance(c, PolyCollection)]
    ys = band.get_paths()[0].vertices[:, 1]
    assert np.isclose(ys.min(), 0.85) and np.isclose(ys.max(), 0.95)
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 1.0
    # the band's edges are lines of their own: visible however narrow the band
    edges = [line for line in ax.get_lines() if np.allclose(line.get_ydata(), 0.85) or
             np.allclose(line.get_ydata(), 0.95)]
    assert len(edges) == 2
    # points not on a line (a single configuration each): each band a bar of its own
    ax = Figure().add_subplot()
    plot.published_beside_band(ax, [1, 2], [5.0, 9.0], [5.0, 5.0], [4.0, 4.0], [6.0, 6.0], [True, False],
                               color="tab:red", joined=False)
    bars, = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert [tuple(s[:, 1]) for s in bars.get_segments()] == [(4.0, 6.0), (4.0, 6.0)]
    assert [line.get_markerfacecolor() for line in ax.get_lines() if "band" in line.get_label()] == ["black",
                                                                                                     "white"]
    # several series on one axis keep apart: their colour filled, their name in every label; a band clipped at ymax
    ax = Figure().add_subplot()
    plot.published_beside_band(ax, gpus, published, predicted, lo, 3 * hi, inside, color="tab:green", ideal=ideal,
                               point_color="tab:green", where=": DDP", ymax=1.5)
    assert ax.get_ylim() == (0, 1.5)
    filled, = [line for line in ax.get_lines() if line.get_label() == "published: DDP, inside the band"]
    assert filled.get_markerfacecolor() == "tab:green"
    assert {line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")} >= {
        "simfog prediction: DDP", "published: DDP, outside the band"}
