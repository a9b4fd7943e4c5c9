"""What NCCL's own `NCCL_DEBUG=INFO` lines in an nccl-tests log state about the cluster (formats read from NCCL's
source, 2.8-2.30: init.cc, net_ib.cc, net_socket.cc, rings.cc, search.cc, topo.cc, nvls.cc; aws-ofi-nccl for
NET/OFI). Every fact is optional: a log without NCCL_DEBUG lines states none.

- release: `NCCL version 2.21.5+cuda12.4`;
- network: `Using network IB` (2.12+), else the `NET/IB`, `NET/Socket`, `NET/OFI` lines;
- nics: devices in `NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ...; OOB ...` (a merged device `[0]={...}`
  counts once), `NET/Socket : Using [0]eth0:... [1]...`, or aws-ofi-nccl's `(found N nics)`; link layer IB / RoCE;
- runtime_channels: comm->nChannels, from `Channel 03/16 :` (rings.cc) or `16 coll channels` (init.cc);
- graph_channels, gpu_nic_path: the ring graph (pattern 4) of `Pattern 4, crossNic 0, nChannels 8, bw 24/24, type
  NVL/PXB, sameChannels 1` (NCCL_DEBUG_SUBSYS with GRAPH), typeInter lowercased (pix, pxb, pxn, phb, sys);
- nvls: `NVLS multicast support is [not ]available` (2.17+);
- cpu_vendor: the topology dump's `CPU/0 (1/2/-1)` (arch/vendor/model; vendor 1 Intel, 2 AMD).
"""

from __future__ import annotations

import re

_RELEASE = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_USING_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_NET_KIND = re.compile(r"NET/(IB|Socket|OFI)\b")
_NET_USING = re.compile(r"NET/(IB|Socket) : Using (.*?)(?:;|$)")
_OFI_NICS = re.compile(r"NET/OFI.*?found (\d+) nics", re.IGNORECASE)
_DEVICE = re.compile(r"\[\d+\]")
_MERGED = re.compile(r"\{[^}]*\}")
_CHANNEL = re.compile(r"NCCL INFO Channel \d+/(\d+) :")
_COLL_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels")
_PATTERN = re.compile(r"Pattern (\d+), crossNic \d+, nChannels (\d+), (?:bw|speed) ([\d.]+)/([\d.]+), type (\w+)/(\w+)")
_NVLS = re.compile(r"NVLS multicast support is (not )?available")
_CPU = re.compile(r"\bCPU/\S+ \((\d+)/(\d+)/-?\d+\)")
_PATHS = {"PIX": "pix", "PXB": "pxb", "PXN": "pxn", "PHB": "phb", "SYS": "sys", "P2C": "pxb", "C2C": "pix"}
_RING_PATTERN = "4"


def read_debug(lines: list[str]) -> dict:
    """The facts above found in `lines` (a dict without the keys it did not find)."""
    out: dict = {}
    text = "\n".join(lines)
    if m := _RELEASE.search(text):
        out["release"] = m.group(1)
    kinds = {m.group(1) for m in _NET_KIND.finditer(text)}
    using = next((m.group(1) for m in map(_USING_NETWORK.search, lines) if m), None)
    if using:
        out["network"] = using
    elif len(kinds) == 1:
        out["network"] = {"IB": "IB", "Socket": "Socket", "OFI": "OFI"}[kinds.pop()]
    for m in map(_NET_USING.search, lines):
        if m:
            devices = _MERGED.sub("", m.group(2))
            out["nics"] = max(out.get("nics", 0), len(_DEVICE.findall(devices)))
            layers = set(re.findall(r"/(IB|RoCE)\b", m.group(2)))
            if len(layers) == 1:
                out["link_layer"] = layers.pop()
    if "nics" not in out and (m := _OFI_NICS.search(text)):
        out["nics"] = int(m.group(1))
    channels = [int(m.group(1)) for m in _CHANNEL.finditer(text)] + [int(m.group(1))
                                                                     for m in _COLL_CHANNELS.finditer(text)]
    if channels:
        out["runtime_channels"] = max(channels)
    rings = [m for m in _PATTERN.finditer(text) if m.group(1) == _RING_PATTERN]
    if rings:
        out["graph_channels"] = max(int(m.group(2)) for m in rings)
        inter = {m.group(6).upper() for m in rings} - {"LOC", "NVL", "NVB"}
        if len(inter) == 1 and inter <= set(_PATHS):
            out["gpu_nic_path"] = _PATHS[inter.pop()]
    nvls = {m.group(1) is None for m in _NVLS.finditer(text)}
    if len(nvls) == 1:
        out["nvls"] = nvls.pop()
    vendors = {m.group(2) for m in _CPU.finditer(text)}
    if len(vendors) == 1 and vendors <= {"1", "2"}:
        out["cpu_vendor"] = {"1": "intel", "2": "amd"}[vendors.pop()]
    return out
