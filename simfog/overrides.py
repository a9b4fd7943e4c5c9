"""The experiment a run asks for: an experiment file, or the embedded default, with the overrides the command line
(`--ranks`, `--merge`, `--collective`, `--threshold`, `--iterations`, `--seed`, and the cluster's `--nodes`,
`--gpus-per-node`, `--nic-bandwidth`, `--network`: simulate, sweep, curve, tune, plan) and the Python API
(simfog.load) share, so that both give the same experiment and the same numbers.

The cluster's overrides are read as the file's [cluster] keys, by the file's own reader (simfog.experiment.load:
every check, and every rule between keys, the same), in place of the file's; a relative --network path is the
working directory's, not the file's. Errors and warnings about them name the option (--nic-bandwidth), not the
file.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

from simfog import experiment
from simfog.data import DEFAULT_EXPERIMENT
from simfog.errors import ConfigError
from simfog.experiment import Experiment

# [cluster] keys the command line sets, each by the option of the same name (gpus_per_node: --gpus-per-node).
CLUSTER_KEYS = ("nodes", "gpus_per_node", "nic_bandwidth", "network")


def load_with_overrides(file: str | os.PathLike | None = None, *, ranks: int | None = None, merge: str | None = None,
                        collective: str | None = None, threshold: str | None = None, iterations: int | None = None,
                        seed: int | None = None, nodes: int | None = None, gpus_per_node: int | None = None,
                        nic_bandwidth: str | None = None, network: str | None = None) -> Experiment:
    """The experiment in `file` (None or "": the embedded default) with each override that is not None applied:
    `nodes`, `gpus_per_node`, `nic_bandwidth` ("100Gbit/s") and `network` (a network file) as the file's [cluster]
    keys (cluster_keys), then through simfog.experiment.override, which reads and checks them as the file's keys
    are: `ranks` (whole nodes of gpus_per_node; not with `nodes`), `merge` (comm.merge), `collective`, `threshold`
    (a size such as "25MiB"), `iterations`, `seed`. Raises ConfigError naming the command line's option (--merge);
    simfog.api.load names its keyword instead."""
    if ranks is not None and nodes is not None:
        raise ConfigError("--nodes", nodes, f"either --ranks ({ranks}) or --nodes, not both")
    path = Path(file) if file else DEFAULT_EXPERIMENT
    given = cluster_keys(nodes=nodes, gpus_per_node=gpus_per_node, nic_bandwidth=nic_bandwidth, network=network)
    with as_options(given, str(path)):
        exp = experiment.load(path, cluster=given)
    changes = {"ranks": ranks, "merge": merge, "collective": collective, "threshold": threshold,
               "iterations": iterations, "seed": seed}
    exp = experiment.override(exp, spelling="--", **{k: v for k, v in changes.items() if v is not None})
    if collective is not None:
        experiment.warn_if_nccl_without_network(exp.comm.collective, exp.network, "--collective")
    return exp


def cluster_keys(**values) -> dict:
    """The [cluster] keys of the overrides that are not None (CLUSTER_KEYS; any other is a TypeError), a relative
    network path made the working directory's (a bare name, which is no file here, passes as written)."""
    unknown = set(values) - set(CLUSTER_KEYS)
    if unknown:
        raise TypeError(f"not a cluster override: {sorted(unknown)}")
    given = {k: v for k, v in values.items() if v is not None}
    net = given.get("network")
    if isinstance(net, str) and net and (Path(net).exists() or os.sep in net or net.endswith(".toml")):
        given["network"] = str(Path(net).absolute())
    return given


def option(key: str) -> str:
    """The command line's spelling of a cluster key: gpus_per_node -> --gpus-per-node."""
    return "--" + key.replace("_", "-")


# How a catalogue names an option's key: option[0] (eth25).nic_bandwidth (simfog.plan.load_catalogue).
OPTION_PREFIX = r"option\[\d+\] \(.*?\)\."


@contextmanager
def as_options(given: Mapping, source: str, prefix: str = re.escape("cluster.")):
    """Errors and warnings about the keys `given` on the command line, raised or issued while `source` (the file
    they were put into) is read, name the option (--nic-bandwidth = '10': ...) rather than the file's key, which
    `prefix` (a regular expression: OPTION_PREFIX for a catalogue's options) and the key name; the rest pass as
    they are."""
    if not given:  # nothing to rename: warnings keep Python's own once-per-place filter
        yield
        return
    keys = {k: re.compile(f"{prefix}{re.escape(k)}") for k in given}
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    except ConfigError as e:
        key = next((k for k, pattern in keys.items() if pattern.fullmatch(e.field)), None)
        if key is None:
            raise
        raise ConfigError(option(key), given[key], e.allowed) from None
    finally:
        for w in caught:
            text = str(w.message)
            for key, pattern in keys.items():
                text = re.sub(f"^{re.escape(source)}: {pattern.pattern}(:| =) ", f"{option(key)}\\1 ", text)
            warnings.warn_explicit(text, w.category, w.filename, w.lineno)
