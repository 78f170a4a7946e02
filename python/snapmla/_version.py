"""The package version, read from its one source: the C header's SNAPMLA_VERSION_* macros.

The wheel's metadata (pyproject.toml) and the CMake project read the same macros. The header is
found beside the package (the wheel installs it as ``snapmla/include/snapmla/snapmla.h``) or in
a source checkout (``include/snapmla/snapmla.h`` above ``python/snapmla``), so the version is
that of the package actually imported, not of whichever distribution is installed.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["header_version", "package_version"]

_DEFINE = re.compile(r"^#define SNAPMLA_VERSION_(MAJOR|MINOR|PATCH)\s+(\d+)\b", re.MULTILINE)


def header_version(text: str) -> str:
    """``"MAJOR.MINOR.PATCH"`` from the text of ``snapmla.h``.

    Raises:
        ValueError: A macro is missing.
    """
    parts = dict(_DEFINE.findall(text))
    missing = [p for p in ("MAJOR", "MINOR", "PATCH") if p not in parts]
    if missing:
        raise ValueError(f"snapmla.h defines no SNAPMLA_VERSION_{missing[0]}")
    return f"{int(parts['MAJOR'])}.{int(parts['MINOR'])}.{int(parts['PATCH'])}"


def package_version() -> str:
    """The version of this package: its header's macros, else the installed metadata."""
    here = Path(__file__).resolve().parent
    for header in (
        here / "include" / "snapmla" / "snapmla.h",  # the installed wheel
        here.parents[1] / "include" / "snapmla" / "snapmla.h",  # a source checkout
    ):
        if header.is_file():
            return header_version(header.read_text(encoding="utf-8"))
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("snapmla")
    except PackageNotFoundError:
        return "0+unknown"
