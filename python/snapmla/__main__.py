"""``python -m snapmla``: where the installed library, header and CMake package are.

    python -m snapmla --cmake-dir     # for CMAKE_PREFIX_PATH / snapmla_DIR
    python -m snapmla --include-dir   # holds snapmla/snapmla.h
    python -m snapmla --library       # path of libsnapmla.so
    python -m snapmla --version       # package and library versions
"""

from __future__ import annotations

import argparse
import sys

from . import __version__, paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snapmla", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--cmake-dir", action="store_true", help="CMake package prefix")
    group.add_argument("--include-dir", action="store_true", help="directory of snapmla/snapmla.h")
    group.add_argument("--library", action="store_true", help="path of libsnapmla.so")
    group.add_argument("--version", action="store_true", help="package and library versions")
    args = parser.parse_args(argv)
    if args.cmake_dir:
        print(paths.cmake_prefix())
    elif args.include_dir:
        print(paths.include_dir())
    elif args.library:
        print(paths.library())
    else:
        from . import version

        print(f"snapmla {__version__} (library {'.'.join(map(str, version()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
