"""Fixtures of the GPU suite: per-test seeded random generators, a device sync after each test.

Every test module here is marked ``gpu``; tests/conftest.py skips them ("no CUDA GPU") on a
machine where neither CuPy nor PyTorch sees a device.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Iterator

import numpy as np
import pytest

# JAX must not grab most of the GPU memory when the JAX tests import it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for `import _util`


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from the test's id: fresh inputs per test, reproducible runs."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _sync_after_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Surfaces asynchronous CUDA errors in the test that caused them."""
    yield
    # Skipped tests never get here, so a `gpu` test that ran had a device.
    if request.node.get_closest_marker("gpu") is not None:
        import _util

        _util.synchronize()
