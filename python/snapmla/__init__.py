"""snapmla: FP8 decode attention for DeepSeek-style Multi-head Latent Attention on Hopper.

A thin Python layer over the C library ``libsnapmla.so`` (cffi, ABI mode). Tensors are taken
from any DLPack producer (CuPy, PyTorch, JAX; NumPy for host-side checks); new outputs are CuPy
arrays. Importing the package needs neither a GPU nor CuPy: the library is loaded, and CuPy
imported, on the first operation that needs them.

Public API: ``KVCache``, ``DecodePlan``, ``decode``, ``quantize_q``, ``SnapMLAError``,
``version()``, the format constants, and the NumPy model of the numerics contract in
``snapmla.reference``.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import paths
from ._errors import SnapMLAError
from ._lib import CONTENT_DIM, HEAD_DIM, PAGE_BYTES, PAGE_SIZE, ROPE_DIM
from ._version import package_version as _package_version
from .cache import KVCache
from .decode import DecodePlan, decode
from .quantize import quantize_q

__version__ = _package_version()  # from the header's SNAPMLA_VERSION_* macros

__all__ = [
    "CONTENT_DIM",
    "HEAD_DIM",
    "PAGE_BYTES",
    "PAGE_SIZE",
    "ROPE_DIM",
    "DecodePlan",
    "KVCache",
    "SnapMLAError",
    "__version__",
    "decode",
    "paths",
    "quantize_q",
    "reference",
    "version",
]


def version() -> tuple[int, int, int]:
    """``(major, minor, patch)`` of the loaded shared library (loading it if needed).

    Works whatever the NVIDIA driver (the driver check is left to the first GPU operation).

    Raises:
        SnapMLAError: The library is missing, cannot be loaded, or has another ABI major.
    """
    from ._lib import open_library, split_version

    return split_version(int(open_library().snapmla_version()))


def __getattr__(name: str) -> Any:
    # snapmla.reference (NumPy + ml_dtypes only) is imported on first access.
    if name == "reference":
        module = importlib.import_module(".reference", __name__)
        globals()["reference"] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
