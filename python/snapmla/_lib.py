"""Binding layer: the cffi (ABI mode) declarations of ``snapmla.h`` and the library loader.

Nothing here touches CUDA at import time. The shared library is opened on the first call that
needs it (``lib()``), from ``$SNAPMLA_LIBRARY`` when set, else from the ``snapmla/lib/`` folder
of the installed package, and is refused when its ABI version does not match these bindings, or
when the NVIDIA driver is too old for the CUDA runtime inside it (``_driver.check_driver``).
"""

from __future__ import annotations

import importlib.resources
import os
import re
import threading
from typing import Any

import cffi

from . import _driver
from ._errors import SnapMLAError

__all__ = [
    "ABI_MAJOR",
    "ABI_MINOR",
    "CDEF",
    "check",
    "ffi",
    "lib",
    "library_path",
    "new_struct",
    "open_library",
    "stream_t",
]

# The header version these declarations mirror (SNAPMLA_VERSION_MAJOR / _MINOR). A library of
# the same major and a minor at least this one provides every declared function and field.
ABI_MAJOR = 0
ABI_MINOR = 4

# The header's constants (SNAPMLA_*; tests/test_cdef.py checks them against it).
PAGE_SIZE = 64
CONTENT_DIM = 512
ROPE_DIM = 64
HEAD_DIM = 576
PAGE_BYTES = 41216
PAGE_CONTENT_OFFSET = 0
PAGE_ROPE_OFFSET = 32768
PAGE_SCALE_OFFSET = 40960
MAX_HEADS = 128
MAX_Q_LEN = 4
MAX_STRUCT_SIZE = 4096

# Mirrors include/snapmla/snapmla.h declaration by declaration (tests/test_cdef.py checks it).
CDEF = """
typedef struct CUstream_st* snapmla_stream_t;

int snapmla_version(void);

typedef enum snapmla_status {
  SNAPMLA_SUCCESS = 0,
  SNAPMLA_ERROR_INVALID_ARGUMENT = 1,
  SNAPMLA_ERROR_UNSUPPORTED = 2,
  SNAPMLA_ERROR_CUDA = 3,
  SNAPMLA_ERROR_OUT_OF_MEMORY = 4,
  SNAPMLA_ERROR_INTERNAL = 5,
  SNAPMLA_VALIDATED = 6
} snapmla_status_t;

const char* snapmla_status_string(snapmla_status_t status);
const char* snapmla_last_error(void);
int snapmla_set_validate_only(int enable);

typedef struct snapmla_cache* snapmla_cache_t;

typedef struct snapmla_cache_config {
  size_t struct_size;
  int32_t num_layers;
  int32_t num_pages;
  int32_t page_size;
  int32_t device;
  void* memory;
  size_t memory_bytes;
  void* const* layer_memory;
  size_t page_stride;
} snapmla_cache_config_t;

typedef struct snapmla_cache_info {
  size_t struct_size;
  void* data;
  int32_t device;
  int32_t num_layers;
  int32_t num_pages;
  int32_t page_size;
  int32_t content_dim;
  int32_t rope_dim;
  size_t page_bytes;
  size_t content_offset;
  size_t rope_offset;
  size_t scale_offset;
  size_t layer_bytes;
  size_t total_bytes;
  int32_t owns_memory;
  int32_t per_layer_memory;
  size_t page_stride;
} snapmla_cache_info_t;

snapmla_status_t snapmla_cache_bytes(int32_t num_layers, int32_t num_pages, size_t* bytes);
snapmla_status_t snapmla_cache_create(const snapmla_cache_config_t* config,
                                      snapmla_cache_t* cache);
snapmla_status_t snapmla_cache_destroy(snapmla_cache_t cache);
snapmla_status_t snapmla_cache_info(snapmla_cache_t cache, snapmla_cache_info_t* info);
snapmla_status_t snapmla_cache_layer_data(snapmla_cache_t cache, int32_t layer, void** data);

snapmla_status_t snapmla_append(snapmla_cache_t cache, int32_t layer,
                                const void* c_kv, int64_t c_kv_stride,
                                const void* k_pe, int64_t k_pe_stride,
                                const int64_t* slots, int64_t num_tokens,
                                snapmla_stream_t stream);

snapmla_status_t snapmla_fetch_dequant(snapmla_cache_t cache, int32_t layer,
                                       const int64_t* slots, int64_t num_tokens,
                                       void* c_kv, int64_t c_kv_stride, void* k_pe,
                                       int64_t k_pe_stride,
                                       snapmla_stream_t stream);

snapmla_status_t snapmla_gather_dequant(
    snapmla_cache_t cache, int32_t layer, const int32_t* block_table, int64_t block_table_stride,
    int32_t batch, int32_t max_pages, const int32_t* seqlens, const int64_t* out_rows,
    int64_t num_rows, void* c_kv, int64_t c_kv_stride, void* k_pe, int64_t k_pe_stride,
    snapmla_stream_t stream);

snapmla_status_t snapmla_copy_slots(snapmla_cache_t cache, int32_t layer,
                                    const int64_t* src_slots, const int64_t* dst_slots,
                                    int64_t num_tokens, snapmla_stream_t stream);

snapmla_status_t snapmla_quantize_q(const void* q, int64_t num_tokens,
                                    int32_t num_heads, int64_t q_stride_token,
                                    int64_t q_stride_head, void* q_content,
                                    void* q_rope, float* q_scale,
                                    snapmla_stream_t stream);

snapmla_status_t snapmla_quantize_q2(const void* q, int64_t num_tokens,
                                     int32_t num_heads, int64_t q_stride_token,
                                     int64_t q_stride_head, void* q_content,
                                     void* q_rope, float* q_scale, void* q_lo,
                                     float* q_lo_scale, snapmla_stream_t stream);

typedef enum snapmla_q_precision {
  SNAPMLA_Q_PRECISION_FP8 = 0,
  SNAPMLA_Q_PRECISION_FP8X2 = 1
} snapmla_q_precision_t;

typedef struct snapmla_decode_config {
  size_t struct_size;
  int32_t batch_size;
  int32_t q_len;
  int32_t num_heads;
  int32_t max_pages;
  int32_t num_sm_parts;
  int32_t q_precision;
  size_t plan_bytes;
  size_t workspace_bytes;
} snapmla_decode_config_t;

typedef enum snapmla_decode_kernel {
  SNAPMLA_DECODE_KERNEL_AUTO = 0,
  SNAPMLA_DECODE_KERNEL_REFERENCE = 1,
  SNAPMLA_DECODE_KERNEL_FAST = 2
} snapmla_decode_kernel_t;

typedef enum snapmla_out_dtype {
  SNAPMLA_OUT_BF16 = 0,
  SNAPMLA_OUT_FP32 = 1
} snapmla_out_dtype_t;

typedef struct snapmla_decode_args {
  size_t struct_size;
  int32_t layer;
  int32_t causal;
  float softmax_scale;
  int32_t kernel;
  const void* q;
  int64_t q_stride_batch;
  int64_t q_stride_token;
  int64_t q_stride_head;
  const int32_t* block_table;
  int64_t block_table_stride;
  const int32_t* cache_seqlens;
  void* out;
  float* lse;
  const void* q_pe;
  int64_t q_pe_stride_batch;
  int64_t q_pe_stride_token;
  int64_t q_pe_stride_head;
  int32_t out_dtype;
} snapmla_decode_args_t;

snapmla_status_t snapmla_decode_select_kernel(const snapmla_decode_config_t* config,
                                              int32_t kernel, int32_t* selected);

snapmla_status_t snapmla_decode_buffer_sizes(const snapmla_decode_config_t* config,
                                             size_t* plan_bytes,
                                             size_t* workspace_bytes);

snapmla_status_t snapmla_decode_plan(const snapmla_decode_config_t* config,
                                     const int32_t* cache_seqlens, void* plan,
                                     snapmla_stream_t stream);

snapmla_status_t snapmla_decode(snapmla_cache_t cache,
                                const snapmla_decode_config_t* config,
                                const snapmla_decode_args_t* args,
                                const void* plan, void* workspace,
                                snapmla_stream_t stream);

"""

ffi = cffi.FFI()
ffi.cdef(CDEF)

_lock = threading.Lock()
_loaded: Any = None
_driver_checked = False


def library_path() -> str:
    """Where the shared library is looked for: ``$SNAPMLA_LIBRARY``, else the packaged copy."""
    env = os.environ.get("SNAPMLA_LIBRARY")
    if env:
        return env
    return str(importlib.resources.files("snapmla") / "lib" / "libsnapmla.so")


def split_version(version: int) -> tuple[int, int, int]:
    """Split ``MAJOR * 10000 + MINOR * 100 + PATCH`` into ``(major, minor, patch)``."""
    return version // 10000, version // 100 % 100, version % 100


def check_version(version: int, path: str) -> None:
    """Refuse a library whose ABI the declarations here do not match.

    The header's rule: MAJOR changes the ABI, MINOR only adds, so bindings written for
    ``ABI_MAJOR.ABI_MINOR`` need the same major and a minor of at least ``ABI_MINOR``.
    """
    major, minor, patch = split_version(version)
    if major != ABI_MAJOR or minor < ABI_MINOR:
        raise SnapMLAError(
            f"snapmla: the library at {path} is version {major}.{minor}.{patch}, but this "
            f"package needs {ABI_MAJOR}.x with x >= {ABI_MINOR} (ABI major versions must "
            "match): install matching versions of the package and the library"
        )


def open_library() -> Any:
    """The loaded library (cffi ``Lib``), opened and version-checked on the first call, with no
    driver check (``version()``, ``python -m snapmla --info``)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is None:
            path = library_path()
            if not os.path.isfile(path):
                raise SnapMLAError(
                    f"snapmla: shared library not found at {path}; install the snapmla wheel, "
                    "or set SNAPMLA_LIBRARY to the path of libsnapmla.so"
                )
            try:
                loaded = ffi.dlopen(path)
            except OSError as exc:
                raise SnapMLAError(f"snapmla: cannot load {path}: {exc}") from exc
            check_version(int(loaded.snapmla_version()), path)
            _loaded = loaded
    return _loaded


def lib() -> Any:
    """The loaded library (``open_library()``) for an operation: the first call also refuses an
    NVIDIA driver older than the library's CUDA runtime needs (``SnapMLAError`` naming the
    driver found and the minimum; ``_driver.check_driver``). No driver at all passes here."""
    global _driver_checked
    loaded = open_library()
    if not _driver_checked:
        _driver.check_driver()
        _driver_checked = True
    return loaded


_ARGUMENT_RE = re.compile(r"'([A-Za-z_][A-Za-z0-9_.\[\]]*)'")


def check(status: int, what: str) -> None:
    """Raise ``SnapMLAError`` carrying ``snapmla_last_error()`` when ``status`` is not success.

    ``what`` names the C function (``"snapmla_append"``); the message reads
    ``"snapmla_append: argument 'c_kv': ... [SNAPMLA_ERROR_INVALID_ARGUMENT]"``: the library's
    message (prefixed with ``what`` unless it already is), then the status name. ``argument``
    is the first quoted name in the library's message, if any.
    """
    status = int(status)
    if status == 0:
        return
    loaded = lib()
    name = ffi.string(loaded.snapmla_status_string(status)).decode("utf-8", "replace")
    message = ffi.string(loaded.snapmla_last_error()).decode("utf-8", "replace")
    match = _ARGUMENT_RE.search(message)
    if not message.startswith(f"{what}:"):
        message = f"{what}: {message}" if message else what
    raise SnapMLAError(
        f"{message} [{name}]", status=status, argument=match.group(1) if match else None
    )


def new_struct(ctype: str, **fields: Any) -> Any:
    """A new ``ctype*`` of the header's versioned structs (``struct_size`` first): zeroed, with
    ``struct_size`` and ``fields`` set."""
    return ffi.new(f"{ctype}*", {"struct_size": ffi.sizeof(ctype), **fields})


_STREAM_T = ffi.typeof("snapmla_stream_t")

# Pointer types resolved once: ffi.cast with a ctype skips the parse cache's lookup.
CTYPES = {
    name: ffi.typeof(name)
    for name in (
        "void*",
        "const void*",
        "float*",
        "const int32_t*",
        "const int64_t*",
    )
}


# snapmla_stream_t values by handle (immutable cdata: any thread may pass the same one), cast
# once rather than at every call. Cleared when full.
_streams: dict[int, Any] = {}


def stream_t(handle: int) -> Any:
    """A ``snapmla_stream_t`` for a raw CUDA stream handle (0 = the legacy default stream)."""
    stream = _streams.get(handle)
    if stream is None:
        stream = ffi.cast(_STREAM_T, handle)
        if len(_streams) >= 256:
            _streams.clear()
        _streams[handle] = stream
    return stream
