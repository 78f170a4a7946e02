"""Fixtures of the GPU suite: a device sync after each test (the seeded `rng` is in
tests/conftest.py, where every test file finds it whatever the order of the paths given).

Every test module here is marked ``gpu``; tests/conftest.py skips them ("no CUDA GPU") on a
machine where neither CuPy nor PyTorch sees a device.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

# JAX must not grab most of the GPU memory when the JAX tests import it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for `import _util`


@pytest.fixture(autouse=True)
def _sync_after_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Surfaces asynchronous CUDA errors in the test that caused them."""
    yield
    # Skipped tests never get here, so a `gpu` test that ran had a device.
    if request.node.get_closest_marker("gpu") is not None:
        import _util

        _util.synchronize()
