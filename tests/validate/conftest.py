"""Shared helpers of the tests that run ranks for real."""

from __future__ import annotations


def emulation_available() -> tuple[bool, str]:
    """(True, "") when torch is installed and network namespaces with tc can be made here, else (False, why)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False, "torch is not installed"
    from validate.cluster import netemu

    return netemu.available()
