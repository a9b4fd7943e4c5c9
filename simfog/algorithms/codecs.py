"""Gradient and weight compression codecs shared by the training algorithms: what they put on the wire and how fast
they encode (BAGUA's MinMaxUInt8, fp16 casts, PowerSGD's passes)."""

from __future__ import annotations

# Codec throughput in bytes of uncompressed data per second per pass over them. Measured on this project's machine
# (AMD EPYC, 2 cores shared, torch 2.13 CPU, 1 thread; 64 MiB of float32, median of 7 runs, the least contended of
# three runs): MinMaxUInt8 quantise 0.54 GB/s and dequantise 1.28 GB/s (0.76 GB/s per pass); fp16 cast 2.1 GB/s
# and back 1.46 GB/s (1.73 GB/s per pass); PowerSGD rank 1 on a 4096×4096 matrix 4.6 GB/s per pass. They suit the
# CPU-measured traces; set comm.encode_bandwidth for GPUs (hundreds of GB/s).
CODEC_BANDWIDTH_Bps = {"minmax_uint8": 0.75e9, "fp16": 1.7e9, "powersgd": 4.5e9}


def codec_bandwidth(comm, kind: str) -> float:
    """comm.encode_bandwidth, else the measured default of codec `kind` (bytes/s per pass)."""
    return comm.encode_bandwidth_Bps or CODEC_BANDWIDTH_Bps[kind]


def minmax_uint8_bytes(elements: int, chunks: int) -> int:
    """Wire bytes of BAGUA's MinMaxUInt8 compression of `elements` float values in `chunks` chunks: per chunk its
    uint8 values and its (min, max) pair, each padded to 32 bytes (bagua-core datatypes
    MinMaxUInt8CompressionParameters::get_compressed_buffer_size)."""
    chunk = -(-elements // chunks)
    return chunks * (-(-chunk // 32) * 32 + 32)
