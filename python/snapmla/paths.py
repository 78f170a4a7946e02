"""Locations of the files the wheel installs for C and C++ users."""

from __future__ import annotations

import importlib.resources

from ._lib import library_path


def _root() -> str:
    return str(importlib.resources.files("snapmla"))


def cmake_prefix() -> str:
    """Prefix to put on ``CMAKE_PREFIX_PATH`` so that ``find_package(snapmla CONFIG)`` works."""
    return _root()


def include_dir() -> str:
    """Directory that holds ``snapmla/snapmla.h``."""
    return f"{_root()}/include"


def library() -> str:
    """Path of ``libsnapmla.so`` (``$SNAPMLA_LIBRARY`` when set)."""
    return library_path()
