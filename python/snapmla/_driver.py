"""The NVIDIA driver, asked directly (ctypes on ``libcuda.so.1``): its version, checked against
the minimum the library's CUDA runtime needs, and the GPUs it sees (``python -m snapmla --info``).

``libsnapmla.so`` links the CUDA 13 runtime statically, and a CUDA 13 runtime needs a driver that
supports CUDA 13.0: release 580 or newer. On an older driver every CUDA call would fail with
``cudaErrorInsufficientDriver``; ``check_driver`` refuses first, naming the driver found and the
minimum. Nothing here raises when there is no driver at all: that is the CUDA runtime's error
to report, at the first call that needs a device.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any, NamedTuple

from ._errors import SnapMLAError

__all__ = [
    "MIN_DRIVER_CUDA_VERSION",
    "MIN_DRIVER_RELEASE",
    "Gpu",
    "check_driver",
    "driver_release",
    "driver_version",
    "format_cuda_version",
    "gpus",
]

# The CUDA runtime linked into libsnapmla.so is 13.x (CMakeLists.txt: nvcc 13, static cudart).
# CUDA's minor version compatibility lets any 13.x runtime run on a driver that supports 13.0,
# which is driver release 580 or newer (CUDA 13.0 release notes, table 3). The number is
# cuDriverGetVersion's encoding, 1000 * major + 10 * minor.
MIN_DRIVER_CUDA_VERSION = 13000
MIN_DRIVER_RELEASE = 580

_SNAPMLA_ERROR_UNSUPPORTED = 2  # snapmla_status_t (_lib.CDEF)
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class Gpu(NamedTuple):
    index: int
    name: str
    capability: tuple[int, int]


@functools.lru_cache(maxsize=1)
def _libcuda() -> Any:
    """The driver library, or ``None`` where there is none (no NVIDIA driver installed)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def driver_version() -> int | None:
    """``cuDriverGetVersion``: the newest CUDA the driver supports (``12040`` = 12.4), or
    ``None`` without a driver."""
    cuda = _libcuda()
    if cuda is None:
        return None
    value = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(value)) != 0:
        return None
    return int(value.value)


def driver_release(proc: str = "/proc/driver/nvidia/version") -> str | None:
    """The kernel module's release (``"550.54.15"``) from ``/proc``, or ``None`` when unknown."""
    try:
        text = Path(proc).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts) and int(parts[0]) >= 100:
            return word
    return None


def format_cuda_version(version: int) -> str:
    """``12040`` -> ``"12.4"``."""
    return f"{version // 1000}.{version % 1000 // 10}"


def check_driver(version: int | None = None, release: str | None = None) -> None:
    """Refuse a driver too old for the library's CUDA runtime (``SnapMLAError``, status
    ``SNAPMLA_ERROR_UNSUPPORTED``). ``version`` and ``release`` default to this machine's
    (``driver_version()``, ``driver_release()``); no driver passes (the runtime reports it)."""
    if version is None:
        version = driver_version()
    if version is None or version >= MIN_DRIVER_CUDA_VERSION:
        return
    if release is None:
        release = driver_release()
    found = f"driver {release}, " if release else "the driver "
    raise SnapMLAError(
        f"snapmla: the NVIDIA driver here is too old: {found}which supports CUDA "
        f"{format_cuda_version(version)}; libsnapmla.so carries the CUDA "
        f"{MIN_DRIVER_CUDA_VERSION // 1000} runtime, which needs driver {MIN_DRIVER_RELEASE} "
        f"or newer (CUDA {format_cuda_version(MIN_DRIVER_CUDA_VERSION)}): update the NVIDIA "
        "driver [SNAPMLA_ERROR_UNSUPPORTED]",
        status=_SNAPMLA_ERROR_UNSUPPORTED,
    )


def gpus() -> list[Gpu]:
    """The GPUs the driver sees (``cuInit`` + device queries); empty without a driver or GPU."""
    cuda = _libcuda()
    if cuda is None or cuda.cuInit(0) != 0:
        return []
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    found = []
    for index in range(count.value):
        device = ctypes.c_int(0)
        name = ctypes.create_string_buffer(256)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        if (
            cuda.cuDeviceGet(ctypes.byref(device), index) != 0
            or cuda.cuDeviceGetName(name, len(name), device) != 0
            or cuda.cuDeviceGetAttribute(
                ctypes.byref(major), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device
            )
            != 0
            or cuda.cuDeviceGetAttribute(
                ctypes.byref(minor), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device
            )
            != 0
        ):
            continue
        found.append(Gpu(index, name.value.decode("utf-8", "replace"), (major.value, minor.value)))
    return found
