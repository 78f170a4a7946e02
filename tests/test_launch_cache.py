"""The decode graphs' bookkeeping (cpp/common/launch_cache.h), host only: tests/cpp/
test_launch_cache.cpp compiled with the system C++ compiler and run (eviction order, capture and
retry decisions, release, a random sequence against a plain model); and the release entry point
in validation-only mode. The graphs themselves: tests/gpu/test_graph_replay_gpu.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "cpp" / "test_launch_cache.cpp"


def _compiler() -> str:
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no C++ compiler")


def test_launch_cache_policy(tmp_path: Path) -> None:
    binary = tmp_path / "test_launch_cache"
    subprocess.run(
        [_compiler(), "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'cpp'}"]
        + [str(SOURCE), "-o", str(binary)],
        check=True,
    )
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all checks passed" in run.stdout


def test_release_in_validation_only_mode() -> None:
    from snapmla import _lib

    lib = _lib.lib()
    previous = lib.snapmla_set_validate_only(1)
    try:
        status = lib.snapmla_release_thread_resources()
        message = _lib.ffi.string(lib.snapmla_last_error()).decode()
    finally:
        lib.snapmla_set_validate_only(previous)
    assert _lib.ffi.string(lib.snapmla_status_string(status)) == b"SNAPMLA_VALIDATED"
    assert message.startswith("snapmla_release_thread_resources: validation-only mode")
