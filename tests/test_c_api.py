"""The C API as a C server sees it: a C99 program built with CMake against the installed
package (header, library, snapmla::snapmla target), run on this machine.

Without a GPU the program checks what needs none: versions, status strings, error messages
that name the argument, cache create/info/destroy on caller memory, decode buffer sizes. On a
GPU machine (marked `gpu`) it also runs append, fetch-dequant and decode through C.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import snapmla

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "c"


def _installed_prefix() -> Path:
    prefix = Path(snapmla.paths.cmake_prefix())
    if not (prefix / "lib" / "cmake" / "snapmla" / "snapmlaConfig.cmake").is_file():
        pytest.skip(f"snapmla is imported from a source tree without its CMake package: {prefix}")
    return prefix


def _build(tmp_path: Path) -> Path:
    if shutil.which("cmake") is None or shutil.which("cc") is None:
        pytest.skip("needs cmake and a C compiler")
    prefix = _installed_prefix()
    build = tmp_path / "build"
    env = dict(os.environ)
    subprocess.run(
        ["cmake", "-S", str(EXAMPLE), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}"],
        check=True, capture_output=True, text=True, env=env,
    )
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True, text=True)
    return build / "snapmla_c_example"


def _run(exe: Path, *args: str) -> str:
    result = subprocess.run([str(exe), *args], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout, result.stdout
    return result.stdout


def test_c_program_links_the_installed_package(tmp_path: Path) -> None:
    out = _run(_build(tmp_path))
    passed = int(out.split(" passed")[0].split()[-1])
    assert passed >= 10, out


@pytest.mark.gpu
def test_c_program_runs_the_kernels(tmp_path: Path) -> None:
    exe = _build(tmp_path)
    out = _run(exe, "--gpu")
    passed = int(out.split(" passed")[0].split()[-1])
    assert passed >= 20, out
