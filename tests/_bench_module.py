"""bench/ scripts as modules, for the CPU tests of the benchmarks and their tools."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def bench_module(path: str) -> ModuleType:
    """bench/<path>.py as a module (e.g. "bench_decode", "flashmla/flashmla")."""
    name = "_bench_" + path.replace("/", "_")
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{path}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module
