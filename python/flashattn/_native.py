"""The C library through ctypes: its structs, its functions, and its statuses as exceptions.

The shared library is the one the install built and put beside this file (``_lib/``), or the
one ``FLASHATTN_LIBRARY`` names, or, in a source tree built with ``make``, ``.libs/`` at its
root. ctypes releases the GIL for the length of every call into it.
"""
from __future__ import annotations

import ctypes
import operator
import os
import threading
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int64,
                    c_size_t, c_uint, c_uint64, c_void_p)

# ------------------------------------------------------------------ the library

def _library_path() -> str:
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(here, "_lib", "libflashattn.so")
    if os.path.exists(bundled):
        return bundled
    tree = os.path.join(here, os.pardir, os.pardir, ".libs", "libflashattn.so")
    if os.path.exists(tree):  # python/flashattn in a source tree built with make
        return os.path.normpath(tree)
    raise ImportError("flashattn: no C library: install the package (pip install . from the "
                      "repository's root builds it), or set FLASHATTN_LIBRARY to a "
                      "libflashattn.so")


lib = ctypes.CDLL(_library_path())

# ------------------------------------------------------------------ enums (include/flashattn.h)
#
# This module mirrors the header by hand: its enum values below, its structs after them. The
# mirror is checked against the header itself, field by field and value by value, by
# python/tests/test_abi.py (which compiles a program against include/flashattn.h for every
# offset, size and value: a new, dropped or reordered field or enumerator fails it); ENUMS and
# STRUCTS say which C type each mirror stands for. The backend and ISA names are the library's
# own (fa_backend_name, fa_isa_name, further down).

FA_OK = 0
(FA_ERR_NULL_POINTER, FA_ERR_INVALID_ARGUMENT, FA_ERR_SHAPE, FA_ERR_STRIDE, FA_ERR_DTYPE,
 FA_ERR_UNSUPPORTED, FA_ERR_OVERFLOW, FA_ERR_NO_MEMORY, FA_ERR_BACKEND_UNAVAILABLE,
 FA_ERR_DEVICE, FA_ERR_COMMUNICATION) = range(1, 12)

F32, F64, F16, BF16, BOOL, E4M3, E5M2, Q8_0, Q4_0 = range(9)
# Q8_0, Q4_0: ggml's blocks, a K/V cache's (attention's kv_dtype=); BLOCK_BYTES: of 32 elements
BLOCK_BYTES = {Q8_0: 34, Q4_0: 18}
DTYPE_NAMES = {F32: "float32", F64: "float64", F16: "float16", BF16: "bfloat16", BOOL: "bool",
               E4M3: "float8_e4m3fn", E5M2: "float8_e5m2", Q8_0: "q8_0", Q4_0: "q4_0"}
ITEMSIZE = {F32: 4, F64: 8, F16: 2, BF16: 2, BOOL: 1, E4M3: 1, E5M2: 1}
FP8 = (E4M3, E5M2)
DESCALE_PER_TENSOR, DESCALE_PER_KV_HEAD = 0, 1

ALIGNS = {"bottom-right": 0, "top-left": 1}
SCORE_ORDERS = {"softcap-then-alibi": 0, "alibi-then-softcap": 1}
INDEX_INT32, INDEX_INT64 = 0, 1
EMPTY_LSE_NEG_INF, EMPTY_LSE_POS_INF, EMPTY_LSE_ANY = range(3)
EMPTY_OUT_ZERO, EMPTY_OUT_NAN, EMPTY_OUT_ANY = range(3)
BIAS_PLACES = {"after-scale": 0, "after-softcap": 1}
GIVEN_ALIGN, GIVEN_SCORE_ORDER, GIVEN_BIAS_PLACE, GIVEN_BIAS_BY_SLOPE = 1, 2, 4, 8
CMP_MAX, CMP_BIAS, CMP_SCALE, CMP_RMS, CMP_DECORR = 1, 2, 4, 8, 16  # fa_comparison.failed

#: Each enum of the header and where its values are here: (a dict of this module keyed by the
#: enumerator's name after `prefix` in lower case with '-' for '_', or None: module constants
#: named as the enumerator after `prefix`; prefix).
ENUMS = {
    "fa_status": (None, ""), "fa_dtype": (None, "FA_"), "fa_align": ("ALIGNS", "FA_ALIGN_"),
    "fa_score_order": ("SCORE_ORDERS", "FA_"), "fa_bias_place": ("BIAS_PLACES", "FA_BIAS_"),
    "fa_descale_layout": (None, "FA_"), "fa_backend": ("BACKENDS", "FA_BACKEND_"),
    "fa_isa": ("ISAS", "FA_ISA_"), "fa_index_type": (None, "FA_"),
    "fa_empty_lse": (None, "FA_"), "fa_empty_out": (None, "FA_"), "fa_given": (None, "FA_"),
    "fa_cmp_test": (None, "FA_"),
}

# ------------------------------------------------------------------ structs


class Tensor(Structure):
    _fields_ = [("data", c_void_p), ("dtype", c_int), ("batch", c_int64), ("seqlen", c_int64),
                ("heads", c_int64), ("headdim", c_int64), ("batch_stride", c_int64),
                ("seq_stride", c_int64), ("head_stride", c_int64), ("headdim_stride", c_int64)]


class Indices(Structure):
    _fields_ = [("data", c_void_p), ("type", c_int), ("count", c_int64)]


class BlockMask(Structure):  # fa_block_mask
    _fields_ = [("batch", c_int64), ("heads", c_int64), ("q_block", c_int64),
                ("kv_block", c_int64), ("kv_num_blocks", Indices), ("kv_indices", Indices),
                ("full_kv_num_blocks", Indices), ("full_kv_indices", Indices)]


class Params(Structure):
    _fields_ = [("scale", c_double), ("causal", c_int), ("window_left", c_int64),
                ("window_right", c_int64), ("align", c_int), ("softcap", c_double),
                ("alibi_slopes", POINTER(c_float)), ("dropout_p", c_double),
                ("dropout_seed", c_uint64), ("dropout_offset", c_uint64), ("score_order", c_int),
                ("sink_logits", POINTER(c_float)), ("sink_grad", POINTER(c_float)),
                ("sink_tokens", c_int64), ("bias", POINTER(Tensor)), ("bias_place", c_int),
                ("bias_by_slope", c_int), ("bias_grad", POINTER(Tensor)),
                ("descale_q", POINTER(c_float)), ("descale_k", POINTER(c_float)),
                ("descale_v", POINTER(c_float)), ("descale_layout", c_int),
                ("block_mask", POINTER(BlockMask))]


class Options(Structure):
    _fields_ = [("backend", c_int), ("isa", c_int), ("num_threads", c_int),
                ("cuda_stream", c_void_p), ("deterministic", c_int)]


class PagedKV(Structure):
    _fields_ = [("block_table", Indices), ("max_pages", c_int64), ("seqused_k", Indices)]


class Tolerance(Structure):
    _fields_ = [("factor", c_double), ("atol", c_double), ("rtol", c_double),
                ("max_only", c_int), ("allowance", c_double), ("allowance_rel", c_double)]


class Comparison(Structure):
    _fields_ = [("max_abs", c_double), ("max_rel", c_double), ("nmse", c_double),
                ("worst", c_int64 * 4), ("worst_cand", c_double), ("worst_ref", c_double),
                ("nonfinite_mismatches", c_int64), ("baseline_err", c_double),
                ("bound", c_double), ("pass_", c_int), ("rule", c_char * 200),
                ("bias", c_double), ("bias_bound", c_double), ("scale", c_double),
                ("scale_bound", c_double), ("rms", c_double), ("rms_bound", c_double),
                ("decorr", c_double), ("decorr_bound", c_double), ("failed", c_int),
                ("ref_max", c_double)]


class Profile(Structure):
    _fields_ = [("name", c_char_p), ("align", c_int), ("lse_base2", c_int),
                ("empty_lse", c_int), ("window_is_count", c_int), ("score_order", c_int),
                ("has_lse", c_int), ("bias_place", c_int), ("bias_by_slope", c_int),
                ("empty_out", c_int), ("descale_layout", c_int)]


#: Each struct of the header and its mirror (a field named as a Python keyword ends in "_").
STRUCTS = {"fa_tensor": Tensor, "fa_indices": Indices, "fa_block_mask": BlockMask,
           "fa_params": Params, "fa_options": Options, "fa_paged_kv": PagedKV,
           "fa_tolerance": Tolerance, "fa_comparison": Comparison, "fa_profile": Profile}


_T = POINTER(Tensor)
_sig = {
    "fa_params_init": (None, [POINTER(Params)]),
    "fa_options_init": (None, [POINTER(Options)]),
    "fa_context_create": (c_int, [POINTER(Options), POINTER(c_void_p)]),
    "fa_context_destroy": (None, [c_void_p]),
    "fa_context_describe": (c_int, [c_void_p, c_char_p, c_size_t]),
    "fa_forward": (c_int, [c_void_p, POINTER(Params), _T, _T, _T, _T, _T]),
    "fa_backward": (c_int, [c_void_p, POINTER(Params), _T, _T, _T, _T, _T, _T, _T, _T, _T]),
    "fa_forward_varlen": (c_int, [c_void_p, POINTER(Params), _T, _T, _T, POINTER(Indices),
                                  POINTER(Indices), _T, _T]),
    "fa_backward_varlen": (c_int, [c_void_p, POINTER(Params), _T, _T, _T, POINTER(Indices),
                                   POINTER(Indices), _T, _T, _T, _T, _T, _T]),
    "fa_forward_paged": (c_int, [c_void_p, POINTER(Params), _T, _T, _T, POINTER(PagedKV), _T,
                                 _T]),
    "fa_append_kv": (c_int, [c_void_p, _T, _T, _T, _T, POINTER(Indices), POINTER(PagedKV)]),
    "fa_forward_kvcache": (c_int, [c_void_p, POINTER(Params), _T, _T, _T, _T, _T,
                                   POINTER(Indices), POINTER(PagedKV), _T, _T]),
    "fa_merge_states": (c_int, [c_int, _T, _T, _T, _T]),
    "fa_compare": (c_int, [_T, _T, _T, POINTER(Tolerance), POINTER(Comparison)]),
    "fa_profile_find": (POINTER(Profile), [c_char_p]),
    "fa_lse_rule": (c_int, [POINTER(Profile), c_int, c_int, c_int, POINTER(c_int),
                            POINTER(Tolerance)]),
    "fa_profile_at": (POINTER(Profile), [c_int]),
    "fa_lse_to_profile": (c_int, [POINTER(Profile), _T]),
    "fa_lse_from_profile": (c_int, [POINTER(Profile), _T]),
    "fa_profile_apply": (c_int, [POINTER(Profile), POINTER(Params), POINTER(c_int64), c_uint]),
    "fa_convert": (c_int, [c_void_p, c_int, c_void_p, c_int, c_size_t]),
    "fa_status_string": (c_char_p, [c_int]),
    "fa_backend_name": (c_char_p, [c_int]),
    "fa_isa_name": (c_char_p, [c_int]),
    "fa_last_error": (c_char_p, []),
    "fa_version_string": (c_char_p, []),
}
for _name, (_res, _args) in _sig.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args


def _names(name_of) -> dict:
    """An enum the library names, as {name: value}: from 0 to the last value it does not call
    "invalid" (its names are those of its registries: FA_BACKEND, FA_ISA, --isa)."""
    names = {}
    while (name := name_of(len(names)).decode()) != "invalid":
        names[name] = len(names)
    return names


BACKENDS = _names(lib.fa_backend_name)
ISAS = _names(lib.fa_isa_name)


def _check_layouts() -> None:
    """The structs the library's init functions fill are the size this module declares: a
    library whose fa_params or fa_options grew (appended fields) would write past them."""
    for struct, init in ((Params, lib.fa_params_init), (Options, lib.fa_options_init)):
        size = ctypes.sizeof(struct)
        buf = (ctypes.c_ubyte * (size + 64))(*([0xA5] * (size + 64)))
        init(ctypes.cast(buf, POINTER(struct)))
        if any(b != 0xA5 for b in buf[size:]):
            raise ImportError(f"flashattn: the C library at {_library_path()} has a larger "
                              f"{struct.__name__[0].lower()}{struct.__name__[1:]} struct than "
                              "this package: a library of another version")


_check_layouts()

# ------------------------------------------------------------------ errors


class FlashAttnError(Exception):
    """A call the library refused or could not complete; ``status`` is its fa_status code.

    Nothing was written to any output when it is raised.
    """

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(FlashAttnError, ValueError):
    """An argument out of its domain: a value, shape, stride, dtype, or size (the message
    names the argument, as fa_last_error() does)."""


class UnsupportedError(FlashAttnError, NotImplementedError):
    """A valid request the chosen backend does not implement (FA_ERR_UNSUPPORTED)."""


class OutOfMemoryError(FlashAttnError, MemoryError):
    """An allocation failed (FA_ERR_NO_MEMORY)."""


class BackendUnavailableError(FlashAttnError, RuntimeError):
    """The backend or ISA asked for is not built or not supported here."""


class DeviceError(FlashAttnError, RuntimeError):
    """The accelerator reported an error (FA_ERR_DEVICE)."""


class CommunicationError(FlashAttnError, RuntimeError):
    """MPI reported an error in a context-parallel call (FA_ERR_COMMUNICATION,
    flashattn.distributed)."""


_EXCEPTIONS = {FA_ERR_UNSUPPORTED: UnsupportedError, FA_ERR_NO_MEMORY: OutOfMemoryError,
               FA_ERR_BACKEND_UNAVAILABLE: BackendUnavailableError, FA_ERR_DEVICE: DeviceError,
               FA_ERR_COMMUNICATION: CommunicationError}


def check_status(status: int, what: str) -> None:
    """Raises the exception of a failed call's status, with the library's detail."""
    if status == FA_OK:
        return
    detail = (lib.fa_last_error() or b"").decode(errors="replace")
    kind = lib.fa_status_string(status).decode()
    raise _EXCEPTIONS.get(status, InvalidArgumentError)(f"{what}: {kind}: {detail}", status)


# ------------------------------------------------------------------ contexts


class _Contexts:
    """One fa_context per (backend, isa, threads, stream, deterministic), made on first use
    and kept: a context may serve several threads at once (include/flashattn.h)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._made: dict = {}

    def get(self, backend: str, isa: str, threads: int, stream: int, deterministic: bool,
            device: int = -1):
        """device: the CUDA device the stream belongs to (current while the context is made
        and used), -1 on the host."""
        key = (backend, isa, threads, stream, deterministic, device)
        ctx = self._made.get(key)
        if ctx is not None:
            return ctx
        if backend not in BACKENDS:
            raise InvalidArgumentError(f"backend={backend!r}: expected one of "
                                       f"{', '.join(BACKENDS)}", FA_ERR_INVALID_ARGUMENT)
        if isa not in ISAS:
            raise InvalidArgumentError(f"isa={isa!r}: expected one of {', '.join(ISAS)}",
                                       FA_ERR_INVALID_ARGUMENT)
        try:
            threads = operator.index(threads)
        except TypeError:
            threads = -1
        if not 0 <= threads < 1 << 31:
            raise InvalidArgumentError(f"threads={threads!r}: expected an int >= 0 (0: "
                                       "OpenMP's default)", FA_ERR_INVALID_ARGUMENT)
        o = Options()
        lib.fa_options_init(ctypes.byref(o))
        o.backend, o.isa, o.num_threads = BACKENDS[backend], ISAS[isa], threads
        o.cuda_stream, o.deterministic = stream or None, int(bool(deterministic))
        handle = c_void_p()
        with self._lock:
            if key not in self._made:
                check_status(lib.fa_context_create(ctypes.byref(o), ctypes.byref(handle)),
                             f"backend {backend!r}")
                self._made[key] = handle
            return self._made[key]


contexts = _Contexts()


def describe(backend: str = "auto", isa: str = "auto", threads: int = 0) -> str:
    """One line: the backend, ISA, threads, caches and tiles a context with these options
    runs with (fa_context_describe)."""
    buf = ctypes.create_string_buffer(4096)
    check_status(lib.fa_context_describe(contexts.get(backend, isa, threads, 0, False), buf,
                                         len(buf)), "describe")
    return buf.value.decode()


def version() -> str:
    return lib.fa_version_string().decode()
