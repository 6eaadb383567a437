"""Arrays of numpy, PyTorch, JAX and CuPy as the library's tensors, and results in the
caller's framework.

An input is read where it lies: a numpy array (ml_dtypes' bfloat16, float8_e4m3fn and
float8_e5m2 included) through its own pointer and strides, any other array through DLPack
(``__dlpack__``; a PyTorch FP8 tensor as its bytes viewed as uint8, which every torch
exports), so no input is copied, whatever its strides; the library itself refuses what it
cannot read (a head dim that is not contiguous, a negative stride) with a message naming the
argument. The one exception is a
JAX array on a GPU, which cannot be written in place: its inputs are copied to the host and
its results put back on its device (flashattn.attention's docstring says so).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
from ctypes import POINTER, Structure, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p

import numpy as np

from . import _native as N

# ------------------------------------------------------------------ DLPack (dlpack.h, v0.8)

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_BOOL = 1, 2, 4, 6
KDL_FLOAT8_E4M3FN, KDL_FLOAT8_E5M2 = 10, 12  # DLPack 1.1 (torch 2.15 exports them)


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", c_int32),
                ("dtype", _DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class _DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


@functools.lru_cache(maxsize=None)
def _get_pointer():
    """CPython's PyCapsule_GetPointer, declared once (DLPack capsules need CPython)."""
    api = getattr(ctypes, "pythonapi", None)
    if api is None:
        raise RuntimeError("flashattn: DLPack arrays need CPython (ctypes.pythonapi)")
    f = api.PyCapsule_GetPointer
    f.restype, f.argtypes = c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return f


def _capsule_pointer(capsule, name: bytes) -> int:
    return _get_pointer()(capsule, name)

_DL_DTYPES = {(KDL_FLOAT, 16): N.F16, (KDL_FLOAT, 32): N.F32, (KDL_FLOAT, 64): N.F64,
              (KDL_BFLOAT, 16): N.BF16, (KDL_BOOL, 8): N.BOOL, (KDL_FLOAT8_E4M3FN, 8): N.E4M3,
              (KDL_FLOAT8_E5M2, 8): N.E5M2}

# ------------------------------------------------------------------ dtypes

#: what a TypeError lists
STORED = "float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2"
#: the dtypes numpy has through ml_dtypes, by their names there (and torch's)
ML_DTYPES = {N.BF16: "bfloat16", N.E4M3: "float8_e4m3fn", N.E5M2: "float8_e5m2"}
_ML_CODE = {name: code for code, name in ML_DTYPES.items()}


def _ml_numpy(dtype: int):
    """ml_dtypes' numpy dtype of BF16, E4M3 or E5M2, or None without ml_dtypes."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(getattr(ml_dtypes, ML_DTYPES[dtype]))


#: numpy's own dtypes the library stores (ml_dtypes' are matched by name)
NUMPY_DTYPES = {np.dtype(np.float32): N.F32, np.dtype(np.float64): N.F64,
                np.dtype(np.float16): N.F16}
_NUMPY_OF = {code: dt for dt, code in NUMPY_DTYPES.items()}
_NO_GUARD = contextlib.nullcontext()


def numpy_dtype(dtype: int) -> np.dtype:
    """The numpy dtype of an fa_dtype (bfloat16 and FP8 need ml_dtypes)."""
    if dtype in ML_DTYPES:
        dt = _ml_numpy(dtype)
        if dt is None:
            raise ImportError(f"flashattn: {ML_DTYPES[dtype]} numpy arrays need ml_dtypes "
                              "(pip install ml_dtypes)")
        return dt
    return _NUMPY_OF[dtype]


def _fa_dtype_of_numpy(dt: np.dtype, name: str) -> int:
    code = NUMPY_DTYPES.get(dt)
    if code is None:  # ml_dtypes' float8_e4m3 (with infinities) and the fnuz kinds are others
        code = _ML_CODE.get(dt.name)
    if code is None and dt == np.bool_:
        code = N.BOOL  # a keep-mask's (Frame.view refuses it elsewhere)
    if code is None:
        raise TypeError(f"{name}: dtype {dt} is not one the library stores ({STORED})")
    return code


def _torch_fp8(t):
    """A PyTorch FP8 tensor's fa_dtype and its bytes viewed as uint8, or (None, t) for any
    other: torch's DLPack exported no FP8 before DLPack 1.1 ("float8 types are not supported
    by dlpack"), and the bytes go through every version."""
    code = _ML_CODE.get(str(t.dtype)[len("torch."):])
    if code not in N.FP8:
        return None, t
    import torch
    return code, t.view(torch.uint8)


# ------------------------------------------------------------------ an array as the library sees it


class View:
    """One array: its data pointer, fa_dtype, shape and strides in elements, and where it
    lives (device type and id, DLPack's); ``keep`` holds what keeps the memory alive."""

    __slots__ = ("ptr", "dtype", "shape", "strides", "device", "keep")

    def __init__(self, ptr, dtype, shape, strides, device, keep):
        self.ptr, self.dtype, self.shape, self.strides = ptr, dtype, shape, strides
        self.device, self.keep = device, keep

    def tensor(self, layout: str, name: str) -> N.Tensor:
        """The 4-D fa_tensor of a (B, S, H, D) array ("bshd") or a (B, H, S, D) one ("bhsd")."""
        if len(self.shape) != 4:
            raise N.InvalidArgumentError(
                f"{name}: expected 4 dims ({'B, S, H, D' if layout == 'bshd' else 'B, H, S, D'}"
                f" for layout {layout!r}), got shape {self.shape}", N.FA_ERR_SHAPE)
        if layout == "bshd":
            return N.Tensor(self.ptr, self.dtype, *self.shape, *self.strides)
        b, h, s, d = self.shape
        sb, sh, ss, sd = self.strides
        return N.Tensor(self.ptr, self.dtype, b, s, h, d, sb, ss, sh, sd)

    def lse_tensor(self, name: str) -> N.Tensor:
        """The fa_tensor of a (B, H, S) LSE array (batch x seqlen x heads, headdim 1)."""
        if len(self.shape) != 3:
            raise N.InvalidArgumentError(f"{name}: expected 3 dims (B, H, S), got shape "
                                         f"{self.shape}", N.FA_ERR_SHAPE)
        (b, h, s), (sb, sh, ss) = self.shape, self.strides
        return N.Tensor(self.ptr, self.dtype, b, s, h, 1, sb, ss, sh, 1)


def _numpy_view(x: np.ndarray, name: str, dtype: int | None = None) -> View:
    code = _fa_dtype_of_numpy(x.dtype, name) if dtype is None else dtype
    item = x.itemsize
    if not x.flags.aligned:  # (aligned: the pointer and every stride whole elements)
        raise N.InvalidArgumentError(f"{name}: the array is not aligned to its {item}-byte "
                                     f"elements (strides {x.strides} bytes)", N.FA_ERR_STRIDE)
    st = x.strides
    strides = ((st[0] // item, st[1] // item, st[2] // item, st[3] // item) if len(st) == 4
               else tuple(s // item for s in st))
    return View(x.ctypes.data, code, x.shape, strides, (KDL_CPU, 0), x)


def _blocks(v: View, block: int, name: str) -> View:
    """A uint8 array's view (strides in bytes) as rows of blocks of format `block` (q8_0,
    q4_0), as the library addresses them: its last dim, a row's bytes, becomes the row's
    elements (32 a block), and every stride bytes to elements; the row itself contiguous."""
    per, fmt = N.BLOCK_BYTES[block], N.DTYPE_NAMES[block]
    if not v.shape:
        raise N.InvalidArgumentError(f"{name}: a 0-d array; {fmt} rows are its last dim",
                                     N.FA_ERR_SHAPE)
    if v.shape[-1] % per or v.shape[-1] == 0:
        raise N.InvalidArgumentError(f"{name}: a row of {v.shape[-1]} bytes is not whole {fmt} "
                                     f"blocks ({per} bytes each: the last dim is the head dim / "
                                     f"32 x {per})", N.FA_ERR_SHAPE)
    if v.strides[-1] != 1 or any(s % per for s in v.strides[:-1]):
        raise N.InvalidArgumentError(f"{name}: strides {v.strides} bytes; {fmt} rows are "
                                     f"contiguous and lie whole blocks ({per} bytes) apart",
                                     N.FA_ERR_STRIDE)
    shape = tuple(v.shape[:-1]) + (v.shape[-1] // per * 32,)
    strides = tuple(s // per * 32 for s in v.strides[:-1]) + (1,)
    return View(v.ptr, block, shape, strides, v.device, v.keep)


def host_view(x: np.ndarray, dtype: int, name: str) -> View:
    """A numpy array whose elements are stored as `dtype` (bfloat16 bits in uint16, say)."""
    return _numpy_view(x, name, dtype)


def _stream_of(framework: str, device_id: int) -> int:
    """The framework's current CUDA stream on that device, as a cudaStream_t (0: the legacy
    default stream)."""
    if framework == "torch":
        import torch
        return torch.cuda.current_stream(device_id).cuda_stream
    if framework == "cupy":
        import cupy
        with cupy.cuda.Device(device_id):
            return cupy.cuda.get_current_stream().ptr
    return 0


def _dlpack_view(x, name: str, framework: str, block: int | None = None) -> tuple[View, int]:
    fp8 = None
    if framework == "torch":
        x = x.detach()  # the same storage; torch refuses to export a tensor that needs grad
        fp8, x = _torch_fp8(x)
    dev_type, dev_id = x.__dlpack_device__()
    dev_type, dev_id = int(dev_type), int(dev_id)
    stream = 0
    if dev_type in (KDL_CUDA, KDL_CUDA_MANAGED):
        stream = _stream_of(framework, dev_id)
        capsule = x.__dlpack__(stream=stream or 1)  # 1: DLPack's legacy default stream
    elif dev_type in (KDL_CPU, KDL_CUDA_HOST):
        capsule = x.__dlpack__()
    else:
        raise N.InvalidArgumentError(f"{name}: arrays on DLPack device type {dev_type} are not "
                                     "supported (CPU or CUDA)", N.FA_ERR_INVALID_ARGUMENT)
    managed = _DLManagedTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    t = managed.dl_tensor
    code = fp8 or _DL_DTYPES.get((t.dtype.code, t.dtype.bits))
    if block is not None:
        if (t.dtype.code, t.dtype.bits, t.dtype.lanes) != (KDL_UINT, 8, 1):
            raise TypeError(f"{name}: kv_dtype {N.DTYPE_NAMES[block]} reads the blocks' bytes: "
                            f"expected a uint8 array, got DLPack dtype code {t.dtype.code}, "
                            f"{t.dtype.bits} bits")
        code = block
    if code is None or t.dtype.lanes != 1:
        raise TypeError(f"{name}: DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, "
                        f"{t.dtype.lanes} lanes) is not one the library stores ({STORED})")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(t.ndim))
    else:  # compact row-major
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= n
        strides = tuple(reversed(strides))
    # the capsule's destructor calls the producer's deleter once the view is dropped
    view = View((t.data or 0) + t.byte_offset, code, shape, strides,
                (KDL_CPU if dev_type == KDL_CUDA_HOST else dev_type, dev_id), (x, capsule))
    return view, stream


def framework_of(x, name: str) -> str:
    if isinstance(x, np.ndarray):
        return "numpy"
    mod = type(x).__module__.split(".")[0]
    if mod in ("torch", "jax", "jaxlib", "cupy"):
        return "jax" if mod == "jaxlib" else mod
    if hasattr(x, "__dlpack__"):
        return "dlpack"
    raise TypeError(f"{name}: expected an array (numpy, PyTorch, JAX, CuPy or any with "
                    f"__dlpack__), got {type(x).__name__}")


class Frame:
    """The framework of a call's arrays: reads them (``view``), allocates its results
    (``empty``) and hands them back (``result``), on the arrays' device and stream. It keeps
    every view it made (and so the DLPack capsules and host copies behind them) until the
    call is over: the library reads their pointers then."""

    def __init__(self, first, name: str):
        self.framework = framework_of(first, name)
        self.stream = 0
        self.host_copy = False  # a JAX GPU array: computed on the host
        self.device = (KDL_CPU, 0)
        self.template = first
        self.views: list = []
        if self.framework in ("numpy",):
            return
        dev_type, dev_id = first.__dlpack_device__()
        self.device = (int(dev_type), int(dev_id))
        if self.framework == "jax" and self.device[0] != KDL_CPU:
            self.host_copy = True
            self.device = (KDL_CPU, 0)
        if self.on_gpu and self.framework not in ("torch", "cupy"):
            raise TypeError(f"{name}: {self.framework} arrays on a GPU: the package allocates "
                            "GPU results with PyTorch or CuPy only")

    @property
    def on_gpu(self) -> bool:
        return self.device[0] in (KDL_CUDA, KDL_CUDA_MANAGED)

    def view(self, x, name: str, mask: bool = False, block: int | None = None) -> View:
        """The view of one of the call's arrays; bool only where `mask` (a keep-mask); a uint8
        array of blocks of format `block` (N.Q8_0, N.Q4_0) where that is given."""
        fw = framework_of(x, name)
        if fw != self.framework:
            raise TypeError(f"{name}: a {fw} array among {self.framework} arrays: pass one "
                            "framework's arrays")
        if fw == "numpy" or self.host_copy:
            x = x if fw == "numpy" else np.asarray(x)
            if block is not None and x.dtype != np.uint8:
                raise TypeError(f"{name}: kv_dtype {N.DTYPE_NAMES[block]} reads the blocks' "
                                f"bytes: expected a uint8 array, got {x.dtype}")
            v = _numpy_view(x, name, block)
        else:
            v, stream = _dlpack_view(x, name, fw, block)
            if v.device != self.device:
                raise N.InvalidArgumentError(f"{name}: on device {v.device}, the call's arrays "
                                             f"on {self.device} (DLPack device type, id)",
                                             N.FA_ERR_INVALID_ARGUMENT)
            self.stream = stream or self.stream
        if block is not None:
            v = _blocks(v, block, name)
        if v.dtype == N.BOOL and not mask:
            raise TypeError(f"{name}: dtype bool is not one the library stores ({STORED}); "
                            "only attn_mask may be bool")
        self.views.append(v)
        return v

    def contiguous(self, x):
        """A row-major copy of one of the call's arrays in its framework (numpy, PyTorch,
        CuPy; an array of another framework is given back as it is)."""
        if self.framework == "torch":
            return x.contiguous()
        if self.framework == "cupy":
            import cupy
            with cupy.cuda.Device(self.device[1]):
                return cupy.ascontiguousarray(x)
        return np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x

    def guard(self):
        """A context manager making the arrays' GPU the current device (the CUDA backend
        reads only the current device's memory); nothing on the host."""
        if self.on_gpu and self.framework == "torch":
            import torch
            return torch.cuda.device(self.device[1])
        if self.on_gpu and self.framework == "cupy":
            import cupy
            return cupy.cuda.Device(self.device[1])
        return _NO_GUARD

    def written(self, *arrays) -> None:
        """Tells PyTorch's autograd that these tensors were written in place (their version
        counter), as its own in-place operations do."""
        if self.framework != "torch":
            return
        import torch
        bump = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)
        for a in arrays:
            if a is not None and bump is not None:
                bump(a)

    def writable(self, x, name: str) -> View:
        """A caller's array the call writes in place (out=, a KV cache)."""
        if self.framework == "jax":
            raise TypeError(f"{name}: JAX arrays are immutable: leave {name} out and take the "
                            "result")
        if isinstance(x, np.ndarray) and not x.flags.writeable:
            raise N.InvalidArgumentError(f"{name}: the array is read-only",
                                         N.FA_ERR_INVALID_ARGUMENT)
        if self.framework == "torch" and getattr(x, "requires_grad", False):
            raise N.InvalidArgumentError(f"{name}: a tensor that requires grad cannot be "
                                         "written in place (as torch's own out= refuses)",
                                         N.FA_ERR_INVALID_ARGUMENT)
        return self.view(x, name)

    def empty(self, shape, dtype: int, name: str):
        """A new array of the call's framework and device, and its view."""
        fw = self.framework
        if fw == "torch":
            import torch
            tdt = {N.F32: torch.float32, N.F64: torch.float64, N.F16: torch.float16,
                   N.BF16: torch.bfloat16}[dtype]
            dev = self.template.device
            a = torch.empty(shape, dtype=tdt, device=dev)
            return a, self.view(a, name)
        if fw == "cupy":
            import cupy
            with cupy.cuda.Device(self.device[1]):
                a = cupy.empty(shape, dtype=numpy_dtype(dtype))
            return a, self.view(a, name)
        a = np.empty(shape, dtype=numpy_dtype(dtype))
        return a, self.view(a, name) if self.framework == "numpy" else _numpy_view(a, name)

    def result(self, a):
        """A result array as the caller's framework holds it (a JAX array is made from the
        host buffer the call wrote, on the device of the call's arrays)."""
        if self.framework == "jax":
            import jax
            return jax.device_put(a, next(iter(self.template.devices())))
        return a

    def from_host(self, a: np.ndarray):
        """A small host result (the sink gradient) in the caller's framework and device."""
        if self.framework == "torch":
            import torch
            return torch.from_numpy(a).to(self.template.device)
        if self.framework == "cupy":
            import cupy
            with cupy.cuda.Device(self.device[1]):
                return cupy.asarray(a)
        return self.result(a)


def index_array(x, name: str) -> tuple[np.ndarray, int]:
    """An int32 or int64 vector or matrix of offsets, lengths or page ids on the host (the
    library reads them there: a device array is copied), and its fa_index_type."""
    if not isinstance(x, np.ndarray):
        fw = framework_of(x, name)
        if fw == "torch":
            x = x.detach().cpu().numpy()
        elif fw == "cupy":
            x = x.get()
        else:
            x = np.asarray(x)
    if x.dtype == np.int32:
        kind = N.INDEX_INT32
    elif x.dtype == np.int64:
        kind = N.INDEX_INT64
    else:
        raise TypeError(f"{name}: expected int32 or int64 entries, got {x.dtype}")
    return np.ascontiguousarray(x), kind


def host_floats(x, name: str) -> np.ndarray:
    """An array of any framework, a list or a number as contiguous float32 on the host."""
    if not isinstance(x, np.ndarray):
        fw = ("python" if isinstance(x, (list, tuple, int, float, np.generic))
              else framework_of(x, name))
        if fw == "torch":
            x = x.detach().float().cpu().numpy()
        elif fw == "cupy":
            x = x.get()
        else:
            x = np.asarray(x)
    return np.ascontiguousarray(x, dtype=np.float32)


def float_vector(x, name: str, n: int) -> np.ndarray | None:
    """Per-head parameters (ALiBi slopes, sink logits): n values as contiguous float32 on the
    host (the library reads n of them)."""
    if x is None:
        return None
    x = host_floats(x, name)
    if x.shape != (n,):
        raise N.InvalidArgumentError(f"{name}: expected one value per query head, shape "
                                     f"({n},), got {x.shape}", N.FA_ERR_SHAPE)
    return x


def to_host(x, name: str):
    """The array's values on the host as numpy (the array itself for numpy, a view of a CPU
    tensor, a copy from a GPU), exactly: bfloat16 and FP8 as ml_dtypes' where it is
    installed, else as their bits in uint16 / uint8; and the fa_dtype of those (None for
    numpy's own dtypes)."""
    if not isinstance(x, np.ndarray):
        fw = framework_of(x, name)
        if fw == "torch":
            import torch
            t = x.detach()
            code = _ML_CODE.get(str(t.dtype)[len("torch."):])
            if code is None:
                return t.cpu().numpy(), None
            word = (torch.int16, np.uint16) if code == N.BF16 else (torch.uint8, np.uint8)
            bits = t.contiguous().view(word[0]).cpu().numpy().view(word[1])
            ml = _ml_numpy(code)
            return (bits if ml is None else bits.view(ml)), code
        x = x.get() if fw == "cupy" else np.asarray(x)
    return x, _ML_CODE.get(x.dtype.name)

