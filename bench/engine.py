"""Wall time of one explicit (every rank simulated) iteration of the ResNet-50 trace on 2048 ranks, ddp + ring, on
the event engine (`--path events`, the default: what horovod, WAGMA, one-sided and asynchronous averaging run on)
or the analytic path (`--path analytic`, what static buckets take by default, on one stream or several;
bench/scale.py measures it at up to 131,072 ranks).

Prints a few lines, the last one `seconds=<float> events_per_s=<float>`. Run: python bench/engine.py [--ranks N]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from simfog import experiment
from simfog.simulation import new_simulation

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=2048)
    parser.add_argument("--merge", default="ddp")
    parser.add_argument("--collective", default="ring")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--path", choices=("events", "analytic"), default="events")
    args = parser.parse_args()
    exp = experiment.load(ROOT / "bench" / "engine-resnet50-cpu.toml").with_ranks(args.ranks)
    exp = replace(exp, iterations=1).with_comm(merge=args.merge, collective=args.collective)
    best = None
    for _ in range(args.repeat):
        started = time.perf_counter()
        sim = new_simulation(exp, symmetric=False, path=args.path)
        result = sim.run()
        seconds = time.perf_counter() - started  # set-up + event loop (not the DataFrame summary)
        if best is None or seconds < best[0]:
            best = (seconds, result.events)
    s = result.summary()
    print(f"model={s['model']} ranks={s['ranks']} merge={s['merge']} collective={s['collective']} "
          f"buckets={s['buckets']} simulated_iteration_s={s['iteration_time_s']:.4f} path={s['path']}")
    print(f"events={best[1]}")
    print(f"seconds={best[0]:.4f} events_per_s={best[1] / best[0] if best[1] else 0:.0f}")


if __name__ == "__main__":
    main()
