import pytest
from hypothesis import given
from hypothesis import strategies as st

from simfog import units
from simfog.errors import ConfigError


@pytest.mark.parametrize("text, kind, expected", [
    ("25Gbit/s", "bandwidth", 25e9 / 8),
    ("12.5GB/s", "bandwidth", 12.5e9),
    ("100Gbps", "bandwidth", 100e9 / 8),
    ("1 MiB/s", "bandwidth", 2**20),
    ("5us", "time", 5e-6),
    ("1.5ms", "time", 1.5e-3),
    ("2 s", "time", 2.0),
    ("25MiB", "bytes", 25 * 2**20),
    ("4KB", "bytes", 4000),
    ("1GiB", "bytes", 2**30),
    ("512B", "bytes", 512),
    ("0.8ns/B", "inverse_bandwidth", 0.8e-9),
    ("1us/KiB", "inverse_bandwidth", 1e-6 / 1024),
])
def test_parses_to_si(text, kind, expected):
    assert units.parse(text, kind) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("text, kind", [
    ("25", "bandwidth"), (25, "time"), ("25MiB", "time"), ("5us", "bytes"), ("fast", "bandwidth"),
    ("-5us", "time"), ("25Gbit", "bandwidth"), (True, "bytes"), ("3 parsecs", "time"),
])
def test_rejects_missing_or_wrong_units(text, kind):
    with pytest.raises(ConfigError) as err:
        units.parse(text, kind, field="cluster.nic_bandwidth", source="exp.toml")
    message = str(err.value)
    assert "exp.toml" in message and "cluster.nic_bandwidth" in message and repr(text) in message


def test_decimal_and_binary_prefixes_differ():
    assert units.nbytes("1GB") == 10**9 and units.nbytes("1GiB") == 2**30


@given(st.floats(min_value=1e-9, max_value=1e6, allow_nan=False))
def test_time_round_trip_through_format(x):
    text = units.format_time(x).replace(" ", "")
    assert units.seconds(text) == pytest.approx(x, rel=5e-3)


def test_formatters():
    assert units.format_bandwidth(25e9 / 8) == "25 Gbit/s"
    assert units.format_bytes(25 * 2**20) == "25 MiB"
    assert units.format_time(1.5e-3) == "1.5 ms"


@pytest.mark.parametrize("text,kind", [("1e400us", "time"), ("1e308s", "time"), ("2e9s", "time"),
                                       ("1e400Gbit/s", "bandwidth"), ("1e30B", "bytes"),
                                       ("1e9s/B", "inverse_bandwidth")])
def test_infinite_or_overflowing_quantities_are_refused(text, kind):
    """Once accepted as inf (or as 1e308, which overflows the simulator's sums) and simulated to nonsense."""
    with pytest.raises(ConfigError, match="at most"):
        units.parse(text, kind, field="cluster.nic_latency")


def test_large_but_real_quantities_pass():
    assert units.parse("1e9s", "time") == 1e9
    assert units.parse("800Gbit/s", "bandwidth") == 1e11
