"""`simfog plan WORKLOAD --target-samples-per-s X` (or `--epoch-samples N --epoch-time 2h`): the cheapest
configurations of a catalogue of clusters that reach the target; `--gpus 16,64,256` (or `--nodes 2,8`): every
option priced and predicted at those counts, without a target."""

from __future__ import annotations

from pathlib import Path

from simfog import units
from simfog.commands.init import catalogue_text
from simfog.commands.simulate import add_cluster_overrides
from simfog.experiment import COMPUTE_MODES

DEFAULT_CATALOGUE = Path(__file__).resolve().parents[1] / "data" / "catalogue.toml"
CATALOGUE_HELP = ("The catalogue (--catalogue FILE): every key, what it means and its default; `simfog init "
                  "--catalogue FILE` writes this\nfor your cluster (docs/catalogue.md says more):\n\n"
                  + catalogue_text({"nodes": 4, "max_nodes": 64, "gpus_per_node": 8, "intra_bandwidth": "150GB/s",
                                    "intra_latency": "2us", "nic_bandwidth": "100Gbit/s", "nic_latency": "10us",
                                    "gpu_memory": "80GB"}))


def add_arguments(parser) -> None:
    parser.add_argument("workload", nargs="?",
                        help="experiment TOML or model trace (.json/.json.gz) (default: the embedded example)")
    parser.add_argument("--catalogue", default=None,
                        help="cluster options with prices (TOML; default: the embedded example, illustrative prices)")
    parser.add_argument("--target-samples-per-s", type=float, help="throughput to reach (samples/s)")
    parser.add_argument("--epoch-samples", type=float, help="samples in one epoch (reports time and cost per epoch)")
    parser.add_argument("--epoch-time", help='time one epoch may take, e.g. "2h" (target = samples / time)')
    parser.add_argument("--gpus", help="GPU counts to price and predict, e.g. 16,64,256 (no target; above one node "
                        "whole nodes of each option)")
    parser.add_argument("--nodes", help="node counts to price and predict, e.g. 2,8,32 (no target)")
    parser.add_argument("--compute", choices=COMPUTE_MODES, default=None,
                        help="layer times (default: the experiment's [workload] compute, as simulate, sweep and "
                        "curve run it; a trace alone: an experiment file's default)")
    parser.add_argument("--samples", action="store_true", help="the same as --compute samples")
    add_cluster_overrides(parser, each="every catalogue option's ")
    parser.epilog = CATALOGUE_HELP
    parser.add_argument("--confidence", type=float, default=None,
                        help="e.g. 0.9: a configuration meets the target only when its throughput reaches it with "
                             "this confidence (the lower bound of its prediction interval; 5 simulations each)")
    parser.add_argument("-o", "--output", metavar="DIR", default=None, help="a folder (made if missing): writes "
                        "DIR/plan.csv (every candidate) and DIR/plan.png (default: a new folder "
                        "simfog-out/plan-<UTC time>/)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing DIR/plan.csv or DIR/plan.png")
    parser.add_argument("--top", type=int, default=10, help="configurations printed (cheapest first)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the table's rows as \"rows\", "
                        "full precision, and the best as \"best\") instead of the table")


def epoch_from_args(args) -> float | None:
    """--epoch-samples, checked (None when not given)."""
    from simfog.errors import ConfigError
    from simfog.trace import MAX_COUNT

    epoch = args.epoch_samples
    if epoch is not None and not 0 < epoch <= MAX_COUNT:  # inf made an "inf h" epoch and a plot that failed
        raise ConfigError("--epoch-samples", epoch, f"a number of samples > 0 and at most {MAX_COUNT:.4g} (2**53)")
    return epoch


def target_from_args(args) -> tuple[float, float | None]:
    """(target samples/s, epoch samples or None) from the options. Raises ConfigError when missing or bad."""
    import math

    from simfog.errors import ConfigError

    epoch = epoch_from_args(args)
    if args.epoch_time is not None:
        if epoch is None:
            raise ConfigError("--epoch-time", args.epoch_time, "used with --epoch-samples N")
        if args.target_samples_per_s is not None:
            raise ConfigError("--target-samples-per-s", args.target_samples_per_s,
                              "either a throughput or --epoch-samples with --epoch-time, not both")
        seconds = units.seconds(args.epoch_time, field="--epoch-time")
        if seconds <= 0:
            raise ConfigError("--epoch-time", args.epoch_time, 'a time > 0, e.g. "2h"')
        return epoch / seconds, epoch
    if args.target_samples_per_s is None:
        raise ConfigError("--target-samples-per-s", None,
                          "a throughput to reach (or --epoch-samples N with --epoch-time, e.g. 2h)")
    if not 0 < args.target_samples_per_s < math.inf:
        raise ConfigError("--target-samples-per-s", args.target_samples_per_s, "a finite throughput in samples/s > 0")
    return args.target_samples_per_s, epoch


def counts_from_args(args) -> dict | None:
    """{"gpus": [...]} or {"nodes": [...]} from --gpus / --nodes, or None when neither is given. Raises ConfigError
    for both, for a target beside them, or for anything but comma-separated positive integers."""
    from simfog.errors import ConfigError
    from simfog.sweeps import count_list

    given = {k: getattr(args, k) for k in ("gpus", "nodes") if getattr(args, k) is not None}
    if not given:
        return None
    if len(given) == 2:
        raise ConfigError("--nodes", args.nodes, "either --gpus or --nodes, not both")
    (name, text), = given.items()
    for flag, value in (("--target-samples-per-s", args.target_samples_per_s), ("--epoch-time", args.epoch_time)):
        if value is not None:
            raise ConfigError(flag, value, f"not used with --{name} (a plan at fixed counts has no target)")
    bad = ConfigError(f"--{name}", text, "comma-separated integers >= 1, e.g. 16,64,256")
    try:
        counts = count_list(text, f"--{name}")
    except ConfigError:
        raise bad from None
    if any(n < 1 for n in counts):
        raise bad
    return {name: counts}


def format_counts_table(result) -> str:
    """Every configuration of a plan at fixed counts, by GPUs then cost; rows that cannot run say why, rows that run
    end with their warnings (simfog.caveats)."""
    cur = result.currency
    epoch = result.epoch_samples is not None
    sure = result.info.get("confidence")
    head = (f"  {'GPUs':>5} {'nodes':>5} {'option':<12} {'collective / merge':<22} {'samples/s':>11}{_sure_head(sure)} "
            f"{'effic.':>7} {'memory':>10} {cur + '/h':>10}" + (f" {'epoch':>9} {cur + '/epoch':>12}" if epoch else ""))
    lines = [head]
    for r in result.candidates.itertuples():
        what = f"  {r.gpus:>5} {r.nodes:>5} {r.option:<12} {r.collective + ' / ' + r.merge:<22}"
        if r.error:
            lines.append(f"{what} {r.error}")
            continue
        lines.append(f"{what} {_numbers(r, epoch, sure)}" + _warnings(r))
    return "\n".join(lines + _sure_note(result))


def _sure_head(confidence: float | None) -> str:
    return "" if confidence is None else f" {f'{100 * confidence:g} % sure':>12}"


def _sure_note(result) -> list[str]:
    """What the confidence column means, and a mark for rows whose interval holds unmeasured parts."""
    sure = result.info.get("confidence")
    if sure is None:
        return []
    rows = result.candidates
    unmeasured = "interval_unmeasured" in rows and (rows.interval_unmeasured.fillna("") != "").any()
    return [f"  {100 * sure:g} % sure: the throughput reached with {100 * sure:g} % confidence (the lower bound of the "
            f"{100 * (2 * sure - 1):g} % prediction interval); the target is met on it"
            + ("; * its interval holds parts nothing measured (a stated width)" if unmeasured else "")]


def _numbers(r, epoch: bool, confidence: float | None = None) -> str:
    """A configuration's throughput (with its lower bound at `confidence`), efficiency, memory and costs, as both
    tables print them."""
    line = f"{r.samples_per_s:>11,.1f}"
    if confidence is not None:
        line += f" {r.samples_per_s_lo:>11,.1f}" + ("*" if getattr(r, "interval_unmeasured", "") else " ")
    line += (f" {100 * r.scaling_efficiency:>6.1f}% "
             f"{_memory(r.memory_peak_B, r.memory_complete):>10} {r.cost_per_hour:>10,.2f}")
    return line + (f" {duration(r.epoch_time_s):>9} {r.cost_per_epoch:>12,.2f}" if epoch else "")


def duration(seconds: float) -> str:
    """'2.03 h', '28.2 min' or units.format_time below a minute (epochs are long)."""
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:.3g} min"
    return units.format_time(seconds)


def _warnings(row) -> str:
    """What a row's number rests on (its `warnings`: simfog.caveats), after two spaces; "" for nothing."""
    text = getattr(row, "warnings", "")
    return f"  {text}" if isinstance(text, str) and text else ""


def format_table(result, top: int) -> str:
    cur = result.currency
    epoch = result.epoch_samples is not None
    sure = result.info.get("confidence")
    head = (f"  {'option':<12} {'GPUs':>5} {'nodes':>5} {'collective / merge':<22} {'samples/s':>11}{_sure_head(sure)} "
            f"{'effic.':>7} {'memory':>10} {cur + '/h':>10}" + (f" {'epoch':>9} {cur + '/epoch':>12}" if epoch else ""))
    fabric = "fabric_cost" in result.candidates
    head += f" {'fabric':>8}" if fabric else ""
    lines = [head]
    for r in result.feasible().head(top).itertuples():
        line = (f"  {r.option:<12} {r.gpus:>5} {r.nodes:>5} {r.collective + ' / ' + r.merge:<22} "
                f"{_numbers(r, epoch, sure)}")
        if fabric:  # what the option's fabric and placement add to the iteration time ("": a flat option)
            line += f" {'' if r.fabric_cost != r.fabric_cost else f'{100 * r.fabric_cost:+.1f}%':>8}"
        lines.append(line + _warnings(r))
    return "\n".join(lines + _sure_note(result))


def _memory(nbytes: float, complete: bool) -> str:
    """The peak per GPU; "+?" when the trace records no activations (the peak then lacks them)."""
    return (units.format_bytes(nbytes) + ("" if complete else "+?")) if nbytes == nbytes else "?"


def _write(result, prefix: str) -> tuple[str, str]:
    from simfog import plot
    from simfog.files import atomic_open

    csv, png = f"{prefix}.csv", f"{prefix}.png"
    plot.save(plot.plan_figure(result), png)  # the figure first: when it cannot be drawn, nothing is written
    try:
        with atomic_open(csv) as f:
            result.candidates.to_csv(f, index=False)
    except BaseException:
        Path(png).unlink(missing_ok=True)
        raise
    return csv, png


def _write_where_asked(result, args) -> tuple[str, str]:
    """DIR/plan.csv and DIR/plan.png for -o DIR (args.output is then DIR/plan), else in a new run folder."""
    from simfog.files import new_run_dir

    if args.output is not None:
        return _write(result, args.output)
    with new_run_dir("plan") as out:
        _write(result, out.path / "plan")
    return str(out.final / "plan.csv"), str(out.final / "plan.png")


def json_records(df) -> list[dict]:
    """DataFrame rows as JSON-ready dicts: numpy scalars as Python numbers, NaN (no value) as null."""
    import json

    return json.loads(df.to_json(orient="records", double_precision=15))


def run(args) -> int:
    import sys

    from simfog.cli import DEFAULT_EXPERIMENT, print_json
    from simfog.commands.outputs import folder_prefix
    from simfog.commands.simulate import cluster_overrides
    from simfog.errors import ConfigError, Infeasible
    from simfog.files import refuse_existing
    from simfog.overrides import OPTION_PREFIX, as_options, cluster_keys
    from simfog.plan import load_catalogue, plan, workload_experiment

    if args.output is not None:
        args.output = folder_prefix(args.output, "plan")  # -o DIR: DIR/plan.* from here on

    counts = counts_from_args(args)
    if counts is None:
        target, epoch = target_from_args(args)
    else:
        target, epoch = None, epoch_from_args(args)
    if args.top < 1:
        raise ConfigError("--top", args.top, "an integer >= 1")
    if args.output is not None:
        refuse_existing([f"{args.output}.csv", f"{args.output}.png"], force=args.force)
    if args.samples and args.compute not in (None, "samples"):
        raise ConfigError("--samples", True, f"--compute samples, not beside --compute {args.compute}")
    compute = "samples" if args.samples else args.compute
    exp = workload_experiment(args.workload or DEFAULT_EXPERIMENT)
    path = str(args.catalogue or DEFAULT_CATALOGUE)
    given = cluster_keys(**{k: v for k, v in cluster_overrides(args).items() if k != "nodes"})
    with as_options(given, path, OPTION_PREFIX):  # --network ... read as every option's own keys
        catalogue = load_catalogue(path, given)
    if counts is not None:
        return _run_counts(args, exp, catalogue, counts, epoch, compute)
    try:
        result = plan(exp, catalogue, target_samples_per_s=target, epoch_samples=epoch, compute=compute,
                      confidence=args.confidence)
    except Infeasible as e:
        if getattr(e, "result", None) is not None:
            csv, png = _write_where_asked(e.result, args)
            print(f"wrote every candidate to {csv}, {png}", file=sys.stderr if args.json else sys.stdout)
        raise
    csv, png = _write_where_asked(result, args)
    top = result.feasible().head(args.top)
    if args.json:
        records = json_records(top)
        print_json({"title": result.title, "target_samples_per_s": result.target_samples_per_s,
                    "epoch_samples": epoch, "currency": result.currency, "ranked_by": result.cost_column,
                    **result.info, "best": records[0], "rows": records, "csv": csv, "png": png})
        print(f"wrote {csv}, {png}", file=sys.stderr)
        return 0
    print(result.title)
    note = f" ({catalogue.note})" if catalogue.note else ""
    print(f"prices from {catalogue.source}{note}; cheapest first, by cost per {'epoch' if epoch else 'hour'}:")
    print(format_table(result, args.top))
    print(f"wrote {csv}, {png}")
    return 0


def _run_counts(args, exp, catalogue, counts: dict, epoch: float | None, compute: str | None) -> int:
    """`plan --gpus` / `--nodes`: every configuration at those counts, priced and predicted."""
    import sys

    from simfog.cli import print_json
    from simfog.pricing import plan_counts

    result = plan_counts(exp, catalogue, epoch_samples=epoch, compute=compute, confidence=args.confidence,
                         **counts)
    csv, png = _write_where_asked(result, args)
    rows = result.candidates
    if args.json:
        records = json_records(rows)
        print_json({"title": result.title, "epoch_samples": epoch, "currency": result.currency, **counts,
                    **result.info, "rows": records, "csv": csv, "png": png})
        print(f"wrote {csv}, {png}", file=sys.stderr)
        return 0
    print(result.title)
    note = f" ({catalogue.note})" if catalogue.note else ""
    print(f"prices from {catalogue.source}{note}; by GPUs, then cost per {'epoch' if epoch else 'hour'}:")
    print(format_counts_table(result))
    print(f"wrote {csv}, {png}")
    return 0
