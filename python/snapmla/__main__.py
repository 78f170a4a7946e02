"""``python -m snapmla``: where the installed library, header and CMake package are.

    python -m snapmla --cmake-dir     # for CMAKE_PREFIX_PATH / snapmla_DIR
    python -m snapmla --include-dir   # holds snapmla/snapmla.h
    python -m snapmla --library       # path of libsnapmla.so
    python -m snapmla --version       # package and library versions
    python -m snapmla --info          # versions, paths, driver, GPUs, which kernels run here
"""

from __future__ import annotations

import argparse
import platform
import sys

from . import __version__, paths

# The library carries sm_90a machine code only (CMakeLists.txt): it runs on compute capability
# 9.0 (H100, H200, GH200) and nowhere else.
KERNEL_CAPABILITY = (9, 0)
KERNELS = "seesaw (AUTO, FAST), reference (REFERENCE)"


def info_lines() -> list[str]:
    """What ``--info`` prints: never raises for want of a GPU, a driver or the library."""
    import cffi
    import numpy

    from . import _driver, _lib

    lines = [f"snapmla {__version__}"]
    try:
        loaded = _lib.open_library()
        abi = ".".join(map(str, _lib.split_version(int(loaded.snapmla_version()))))
        lines.append(f"library: {abi} (ABI {_lib.ABI_MAJOR}.{_lib.ABI_MINOR}+ expected)")
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        lines.append(f"library: not loadable: {exc}")
    lines += [
        f"library path: {paths.library()}",
        f"include dir: {paths.include_dir()}",
        f"CMake package: {paths.cmake_prefix()} (for CMAKE_PREFIX_PATH)",
        f"Python {platform.python_version()}, numpy {numpy.__version__}, cffi {cffi.__version__}",
    ]
    version = _driver.driver_version()
    if version is None:
        lines += ["driver: no NVIDIA driver", "GPUs: none", _kernel_line([], None)]
        return lines
    release = _driver.driver_release()
    ok = version >= _driver.MIN_DRIVER_CUDA_VERSION
    lines.append(
        f"driver: {release + ', ' if release else ''}CUDA {_driver.format_cuda_version(version)}"
        + (
            ""
            if ok
            else f" (too old: the library needs driver {_driver.MIN_DRIVER_RELEASE} or newer)"
        )
    )
    gpus = _driver.gpus()
    lines.append("GPUs: none" if not gpus else "GPUs:")
    lines += [
        f"  {g.index}: {g.name} (compute capability {g.capability[0]}.{g.capability[1]})"
        for g in gpus
    ]
    lines.append(_kernel_line(gpus, ok))
    return lines


def _kernel_line(gpus: list, driver_ok: bool | None) -> str:
    hopper = [g for g in gpus if tuple(g.capability) == KERNEL_CAPABILITY]
    if not hopper:
        return "decode kernels: none here: they need an sm_90 (Hopper) GPU"
    if not driver_ok:
        return "decode kernels: none here: the driver is too old"
    where = ", ".join(str(g.index) for g in hopper)
    return f"decode kernels: {KERNELS} on GPU {where}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snapmla", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--cmake-dir", action="store_true", help="CMake package prefix")
    group.add_argument("--include-dir", action="store_true", help="directory of snapmla/snapmla.h")
    group.add_argument("--library", action="store_true", help="path of libsnapmla.so")
    group.add_argument("--version", action="store_true", help="package and library versions")
    group.add_argument(
        "--info", action="store_true", help="versions, paths, driver, GPUs, kernels that run here"
    )
    args = parser.parse_args(argv)
    if args.cmake_dir:
        print(paths.cmake_prefix())
    elif args.include_dir:
        print(paths.include_dir())
    elif args.library:
        print(paths.library())
    elif args.info:
        print("\n".join(info_lines()))
    else:
        from . import version

        print(f"snapmla {__version__} (library {'.'.join(map(str, version()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
