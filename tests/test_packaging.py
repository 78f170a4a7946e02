"""The shipped library as a C++ server or a wheel user gets it: one file that needs no CUDA
runtime of its own (it is linked in statically), exports only snapmla_* symbols, and carries
sm_90a machine code."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import snapmla


def _library() -> Path:
    path = Path(snapmla.paths.library())
    if not path.is_file():
        pytest.skip(f"the shared library is not installed here: {path}")
    return path


def _run(*cmd: str) -> str:
    if shutil.which(cmd[0]) is None:
        pytest.skip(f"needs {cmd[0]} (binutils)")
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def test_exports_only_snapmla_symbols() -> None:
    out = _run("nm", "-D", "--defined-only", str(_library()))
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert names, "no exported symbols"
    assert all(n.startswith("snapmla_") for n in names), [n for n in names if "snapmla_" not in n]
    for fn in ("snapmla_decode", "snapmla_append", "snapmla_fetch_dequant", "snapmla_quantize_q"):
        assert fn in names


def test_needs_no_cuda_runtime_or_cxx_runtime() -> None:
    out = _run("readelf", "-d", str(_library()))
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", out)
    assert not [n for n in needed if "cudart" in n or "libcuda" in n], needed
    assert not [n for n in needed if "libstdc++" in n], needed


def test_carries_sm90a_code() -> None:
    data = _library().read_bytes()
    assert b"sm_90a" in data
