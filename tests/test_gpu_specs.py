"""The GPU table simfog ships (simfog/data/gpus.toml): every value cited, names and aliases unambiguous, figures
consistent with each other, and `simfog list devices`."""

import tomllib

import pytest

from simfog.errors import ConfigError
from simfog.gpu.specs import DEVICES, TABLE, normalise

RAW = tomllib.loads(TABLE.read_text())
FIELDS = ("sms", "boost_clock_MHz", "fp32_TFLOPS", "memory_GBps", "l2_MB", "memory_GB", "board_power_W")


@pytest.mark.parametrize("gpu", RAW["gpu"], ids=lambda g: g["name"])
def test_every_value_names_a_source(gpu):
    for key in FIELDS:
        assert gpu["source"].get(key) in RAW["sources"], (gpu["name"], key)
    for key in ("tf32_TFLOPS", "fp16_TFLOPS", "bf16_TFLOPS"):
        # a tensor-core figure above FP32 is cited; one equal to FP32 is the table's stated rule (no such units)
        assert gpu[key] == gpu["fp32_TFLOPS"] or gpu["source"].get(key) in RAW["sources"], (gpu["name"], key)
    if "derived" in gpu["source"].values():
        assert gpu.get("note"), f"{gpu['name']}: a derived value needs its formula in the note"


@pytest.mark.parametrize("gpu", RAW["gpu"], ids=lambda g: g["name"])
def test_fp32_peak_is_lanes_times_sms_times_clock(gpu):
    """FP32 peak = 2 x (64 or 128 lanes) x SMs x boost clock, within the datasheets' rounding (3 %)."""
    lanes = gpu["fp32_TFLOPS"] * 1e12 / (2 * gpu["sms"] * gpu["boost_clock_MHz"] * 1e6)
    assert min(abs(lanes - 64), abs(lanes - 128)) / lanes < 0.03, (gpu["name"], lanes)


def test_the_issue_s_gpus_are_all_there_and_names_resolve():
    for name in ("v100", "a100", "h100", "h200", "a10", "l4", "l40s", "h100-pcie", "b200", "gb200", "t4", "p4",
                 "p100", "a100-pcie-80gb", "gtx-1080-ti", "m40", "titan-x-maxwell", "titan-x-pascal", "titan-xp"):
        assert name in DEVICES
    # the names torch.cuda.get_device_name() gives, as the sources wrote them
    assert DEVICES.get("NVIDIA A100-SXM4-40GB").name == "a100"
    assert DEVICES.get("Tesla V100-PCIE-32GB").name == "v100-pcie"
    assert DEVICES.get("NVIDIA H100 80GB HBM3").name == "h100"
    assert DEVICES.get("NVIDIA A100 80GB PCIe").name == "a100-pcie-80gb"
    assert normalise("NVIDIA GeForce RTX 3090 Ti") == "rtx-3090-ti"
    owners: dict[str, set] = {}
    for g in RAW["gpu"]:
        for a in [g["name"], *g.get("aliases", [])]:
            owners.setdefault(normalise(a), set()).add(g["name"])
    assert all(len(v) == 1 for v in owners.values()), {k: v for k, v in owners.items() if len(v) > 1}
    with pytest.raises(ConfigError, match="device"):
        DEVICES.get("tpu-v5")


def test_si_units_inside():
    h200 = DEVICES.get("h200")
    assert h200.memory_Bps == 4.8e12 and h200.l2_bytes == 50 * 2**20 and h200.clock_Hz == 1.98e9
    assert h200.peak_flops["tf32"] == 494.5e12 and h200.has_tensor_cores("tf32")
    assert not DEVICES.get("v100").has_tensor_cores("tf32") and DEVICES.get("v100").has_tensor_cores("fp16")
    assert DEVICES.get("l4").shared_fp32_lanes and not DEVICES.get("h100").shared_fp32_lanes


def test_list_devices(capsys):
    from simfog import cli

    assert cli.main(["list", "devices"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("devices:") and "h200" in out and "4800 GB/s" in out
    assert out.count("\n") == 1 + len(RAW["gpu"])
