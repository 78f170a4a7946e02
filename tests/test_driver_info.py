"""The driver check (a CUDA 13 runtime needs driver 580+) and ``python -m snapmla --info``, on a
machine without a GPU: the driver's answers are faked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import snapmla
from snapmla import _driver, _lib
from snapmla.__main__ import info_lines

OLD_PROC = """NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 19:15:30 UTC 2024
GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)
"""


def _has_library() -> bool:
    return Path(_lib.library_path()).is_file()


def test_minimum_is_cuda_13_driver_580() -> None:
    assert _driver.MIN_DRIVER_CUDA_VERSION == 13000 and _driver.MIN_DRIVER_RELEASE == 580
    assert _driver.format_cuda_version(12040) == "12.4"
    assert _driver.format_cuda_version(13000) == "13.0"


def test_driver_release_from_proc(tmp_path: Path) -> None:
    proc = tmp_path / "version"
    proc.write_text(OLD_PROC)
    assert _driver.driver_release(str(proc)) == "550.54.15"
    assert _driver.driver_release(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("version", [None, 13000, 13010, 14000])
def test_new_enough_or_no_driver_passes(version: int | None, monkeypatch) -> None:
    monkeypatch.setattr(_driver, "driver_version", lambda: version)
    _driver.check_driver()  # no driver: the CUDA runtime reports it, at the first device call


def test_old_driver_is_refused_naming_found_and_minimum(monkeypatch) -> None:
    monkeypatch.setattr(_driver, "driver_version", lambda: 12040)
    monkeypatch.setattr(_driver, "driver_release", lambda: "550.54.15")
    with pytest.raises(snapmla.SnapMLAError) as info:
        _driver.check_driver()
    message = str(info.value)
    assert "550.54.15" in message and "CUDA 12.4" in message, message
    assert "580 or newer" in message and "CUDA 13.0" in message, message
    assert info.value.status == 2  # SNAPMLA_ERROR_UNSUPPORTED
    # Without /proc (a container without the module's file), the CUDA version still names it.
    with pytest.raises(snapmla.SnapMLAError, match=r"supports CUDA 12\.4.*580"):
        _driver.check_driver(12040, "")


@pytest.mark.skipif(not _has_library(), reason="needs the shared library")
def test_first_use_refuses_old_driver_version_does_not(monkeypatch) -> None:
    monkeypatch.setattr(_lib, "_loaded", None)
    monkeypatch.setattr(_lib, "_driver_checked", False)
    monkeypatch.setattr(_driver, "driver_version", lambda: 12080)
    monkeypatch.setattr(_driver, "driver_release", lambda: "570.86.10")
    assert snapmla.version()[0] == _lib.ABI_MAJOR  # loads without the driver check
    with pytest.raises(snapmla.SnapMLAError, match=r"570\.86\.10.*580 or newer"):
        _lib.lib()
    with pytest.raises(snapmla.SnapMLAError, match="580"):  # refused again, not cached
        _lib.lib()
    monkeypatch.setattr(_driver, "driver_version", lambda: 13000)
    assert _lib.lib() is _lib.open_library()


def test_no_driver_query_on_this_machine_raises() -> None:
    """On the real machine: a version or None, never an exception."""
    version = _driver.driver_version()
    assert version is None or version > 1000
    assert isinstance(_driver.gpus(), list)


def _info(monkeypatch, version, gpus, release="580.65.06") -> str:
    monkeypatch.setattr(_driver, "driver_version", lambda: version)
    monkeypatch.setattr(_driver, "driver_release", lambda: release)
    monkeypatch.setattr(_driver, "gpus", lambda: gpus)
    return "\n".join(info_lines())


def test_info_without_driver(monkeypatch) -> None:
    text = _info(monkeypatch, None, [])
    assert f"snapmla {snapmla.__version__}" in text
    assert "driver: no NVIDIA driver" in text
    assert "decode kernels: none here: they need an sm_90 (Hopper) GPU" in text
    assert f"CMake package: {snapmla.paths.cmake_prefix()}" in text


def test_info_on_hopper(monkeypatch) -> None:
    gpus = [_driver.Gpu(0, "NVIDIA A100", (8, 0)), _driver.Gpu(1, "NVIDIA H200", (9, 0))]
    text = _info(monkeypatch, 13000, gpus)
    assert "driver: 580.65.06, CUDA 13.0" in text
    assert "1: NVIDIA H200 (compute capability 9.0)" in text
    assert "decode kernels: seesaw (AUTO, FAST), reference (REFERENCE) on GPU 1" in text


def test_info_on_other_gpus_or_old_driver(monkeypatch) -> None:
    text = _info(monkeypatch, 13000, [_driver.Gpu(0, "NVIDIA L40S", (8, 9))])
    assert "decode kernels: none here: they need an sm_90 (Hopper) GPU" in text
    text = _info(monkeypatch, 12040, [_driver.Gpu(0, "NVIDIA H100", (9, 0))], "550.54.15")
    assert "too old: the library needs driver 580 or newer" in text
    assert "decode kernels: none here: the driver is too old" in text


def test_info_command_exits_0() -> None:
    """The real command, in a subprocess, on whatever this machine has (no GPU in CI)."""
    done = subprocess.run(
        [sys.executable, "-m", "snapmla", "--info"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"snapmla {snapmla.__version__}\n"), done.stdout
    assert "decode kernels:" in done.stdout and "CMake package:" in done.stdout
