"""The version has one source, the header's SNAPMLA_VERSION_MAJOR / _MINOR / _PATCH: the wheel's
metadata, the CMake project, the Python package and the built library all agree with it, and no
build file spells out a version of its own."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

import snapmla
from snapmla._version import header_version

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "include" / "snapmla" / "snapmla.h"


def _source_version() -> str:
    return header_version(HEADER.read_text(encoding="utf-8"))


def _pyproject() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_header_version_parses() -> None:
    text = "#define SNAPMLA_VERSION_MAJOR 2\n#define SNAPMLA_VERSION_MINOR 10\n"
    assert header_version(text + "#define SNAPMLA_VERSION_PATCH  3 /* x */\n") == "2.10.3"
    with pytest.raises(ValueError, match="PATCH"):
        header_version(text)
    assert re.fullmatch(r"\d+\.\d+\.\d+", _source_version())


def test_pyproject_reads_the_header() -> None:
    """pyproject.toml has no version of its own; scikit-build-core's regex provider, run here
    as it runs it, reads the header's macros."""
    data = _pyproject()
    assert "version" not in data["project"]
    assert "version" in data["project"]["dynamic"]
    config = data["tool"]["scikit-build"]["metadata"]["version"]
    assert config["provider"] == "scikit_build_core.metadata.regex"
    assert (ROOT / config["input"]).resolve() == HEADER
    match = re.search(config["regex"], HEADER.read_text(encoding="utf-8"), re.MULTILINE)
    assert match, config["regex"]
    assert config["result"].format(*match.groups(), **match.groupdict()) == _source_version()


def test_no_build_file_spells_out_a_version() -> None:
    cmake = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    project = re.search(r"^project\(([^)]*)\)", cmake, re.MULTILINE | re.DOTALL)
    assert project and not re.search(r"VERSION\s+\d", project.group(1)), project
    assert "include/snapmla/snapmla.h" in cmake
    for path in (ROOT / "python" / "snapmla").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"__version__\s*=\s*['\"]", text), path


def test_python_package_version() -> None:
    assert snapmla.__version__ == _source_version()


def test_installed_metadata_version() -> None:
    try:
        installed = importlib.metadata.version("snapmla")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("snapmla is not installed (running from the source tree)")
    assert installed == _source_version()


def test_installed_header_and_cmake_package() -> None:
    """The wheel's header and CMake package version file carry the source's version (the
    latter from CMake's project(VERSION), which CMakeLists.txt reads from the header)."""
    header = Path(snapmla.paths.include_dir(), "snapmla", "snapmla.h")
    config = Path(snapmla.paths.cmake_prefix(), "lib", "cmake", "snapmla")
    config = config / "snapmlaConfigVersion.cmake"
    if not header.is_file() or not config.is_file():
        pytest.skip("no installed wheel here (running from the source tree)")
    assert header_version(header.read_text(encoding="utf-8")) == _source_version()
    found = re.search(r'set\(PACKAGE_VERSION "([^"]+)"\)', config.read_text(encoding="utf-8"))
    assert found and found.group(1) == _source_version()


def test_library_version() -> None:
    try:
        loaded = snapmla.version()
    except snapmla.SnapMLAError as e:
        pytest.skip(f"the library cannot be loaded here: {e}")
    assert ".".join(map(str, loaded)) == _source_version()
