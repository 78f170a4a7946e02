"""The decode kernel's fragment bindings, bit-exact on integer data (tests/cuda/seesaw_fragments.cu).

The CUDA program runs the kernel's own helpers (ldmatrix.trans + byte permutes for V^T, P8 packed
from S fragments and stored with stmatrix, the PV wgmma at N = 16, 32, 64) on small integers, so
the product must equal the host's exactly. It is compiled here with the machine's nvcc.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def _nvcc() -> str:
    found = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")
    if found is None:
        pytest.skip("needs nvcc to build tests/cuda/seesaw_fragments.cu")
    return found


def test_fragment_mapping_is_exact(tmp_path: Path) -> None:
    exe = tmp_path / "seesaw_fragments"
    subprocess.run(
        [_nvcc(), "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", f"-I{ROOT / 'cpp'}",
         f"-I{ROOT / 'include'}", str(ROOT / "tests" / "cuda" / "seesaw_fragments.cu"), "-o",
         str(exe)],
        check=True, capture_output=True, text=True,
    )
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    print(run.stdout)
    assert run.returncode == 0 and run.stdout.strip().endswith("PASS"), run.stdout + run.stderr
