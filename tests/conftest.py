"""Shared pytest configuration: the `gpu` marker and the skip rule for machines without a GPU."""

from __future__ import annotations

import functools
import zlib

import numpy as np
import pytest

NO_GPU_REASON = "no CUDA GPU"


@functools.cache
def cuda_device_available() -> bool:
    """True when CuPy or PyTorch can see at least one CUDA device (never raises)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return True
    except (ImportError, OSError, RuntimeError):  # not installed, no driver, no device
        pass  # fall through to torch
    try:
        import torch

        return bool(torch.cuda.is_available())
    except (ImportError, OSError, RuntimeError):
        return False


def require_gpu() -> None:
    """Skips the calling test with the reason "no CUDA GPU" when no device is visible."""
    if not cuda_device_available():
        pytest.skip(NO_GPU_REASON)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from the test's id: fresh inputs per test, reproducible runs."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (Hopper, sm_90a)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not cuda_device_available():
        skip = pytest.mark.skip(reason=NO_GPU_REASON)
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)
