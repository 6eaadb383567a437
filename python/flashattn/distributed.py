"""Context parallelism over MPI (mpi4py): one sequence sharded over the ranks of a
communicator, forward and backward, with the results of one call over the whole sequence
(include/flashattn_mpi.h; docs/DESIGN.md §2, "Context parallelism").

    from mpi4py import MPI
    import flashattn.distributed as cp
    shard = cp.local_size(S, MPI.COMM_WORLD)            # this rank's global rows
    out, lse = cp.attention(q, k, v, comm=MPI.COMM_WORLD, causal=True, return_lse=True)
    dq, dk, dv = cp.attention_backward(dout, q, k, v, out, lse, comm=MPI.COMM_WORLD,
                                       causal=True)

Each rank passes its shard (host arrays: numpy, or PyTorch / JAX on the CPU): q, out, dout
its query rows, k and v its keys, in the order `cp_layout` gives them ("zigzag", the default:
2W chunks, rank r holds chunks r and 2W - 1 - r; or "contiguous"). Every call is collective;
every rank returns or raises alike (a bad argument on any rank raises on all of them, naming
the rank). It needs a library built `./configure --with-mpi` against the MPI that mpi4py
uses (FLASHATTN_LIBRARY names it); otherwise the functions raise UnsupportedError.
"""
from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_int, c_int64, c_void_p
from typing import NamedTuple, Tuple

from . import _native as N
from ._api import (_backward_operands, _Call, _dense_outputs, _forward_results, _grad_results,
                   _layout, _options)
from ._arrays import Frame

_CP_LAYOUTS = {"contiguous": 0, "zigzag": 1}  # fa_cp_layout


class _Shard(ctypes.Structure):
    """fa_cp_shard (flashattn_mpi.h)."""
    _fields_ = [("seqlen", c_int64), ("parts", c_int), ("first", c_int64 * 2),
                ("count", c_int64 * 2), ("local", c_int64)]


class Shard(NamedTuple):
    """A rank's rows of a sequence of `seqlen`: `parts`, each (first global row, count), held
    one after the other; `local` rows in all."""
    seqlen: int
    parts: Tuple[Tuple[int, int], ...]
    local: int


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise N.UnsupportedError("flashattn.distributed needs mpi4py",
                                 N.FA_ERR_UNSUPPORTED) from e
    return MPI


def _lib(name: str):
    """The library's function `name`, declared once; UnsupportedError in a build without MPI."""
    f = getattr(N.lib, name, None) if hasattr(N.lib, "fa_cp_local_size") else None
    if f is None:
        raise N.UnsupportedError(f"{name}: the library was built without --with-mpi",
                                 N.FA_ERR_UNSUPPORTED)
    if f.argtypes is None:
        MPI = _mpi()
        comm = c_void_p if MPI._sizeof(MPI.Comm) == ctypes.sizeof(c_void_p) else c_int
        t, p = POINTER(N.Tensor), POINTER(N.Params)
        f.restype = c_int
        f.argtypes = {"fa_cp_local_size": [c_int, c_int64, c_int, c_int, POINTER(_Shard)],
                      "fa_cp_forward": [c_void_p, comm, c_int, p, t, t, t, t, t],
                      "fa_cp_backward": [c_void_p, comm, c_int, p] + [t] * 9}[name]
    return f


def _cp_layout(cp_layout: str) -> int:
    if cp_layout not in _CP_LAYOUTS:
        raise N.InvalidArgumentError(f"cp_layout={cp_layout!r}: expected one of "
                                     f"{sorted(_CP_LAYOUTS)}", N.FA_ERR_INVALID_ARGUMENT)
    return _CP_LAYOUTS[cp_layout]


def _comm(comm):
    """The communicator's handle, as the library takes it."""
    MPI = _mpi()
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm: expected an mpi4py communicator, got {type(comm).__name__}")
    return MPI._handleof(comm)


def local_size(seqlen: int, comm=None, *, cp_layout: str = "zigzag", ranks: int = None,
               rank: int = None) -> Shard:
    """The rows of a rank (comm's own, or `rank` of `ranks`) for a global length seqlen
    (fa_cp_local_size): where to cut q, k and v."""
    if comm is not None:
        ranks, rank = comm.Get_size(), comm.Get_rank()
    if ranks is None or rank is None:
        raise TypeError("local_size: give comm, or ranks and rank")
    s = _Shard()
    N.check_status(_lib("fa_cp_local_size")(_cp_layout(cp_layout), seqlen, ranks, rank,
                                            byref(s)), "cp_local_size")
    return Shard(s.seqlen, tuple((s.first[i], s.count[i]) for i in range(s.parts)), s.local)


def _host_frame(q) -> Frame:
    frame = Frame(q, "q")
    if frame.on_gpu:
        raise N.UnsupportedError("flashattn.distributed: the arrays are on a GPU; context "
                                 "parallelism runs on the host backends", N.FA_ERR_UNSUPPORTED)
    return frame


@_options("score dropout backend isa threads")
def attention(q, k, v, *, comm, cp_layout: str = "zigzag", layout: str = "bshd",
              return_lse: bool = False, **opts):
    """flashattn.attention over the whole sequence of which q, k, v are this rank's shard
    (fa_cp_forward). Returns this rank's rows of out (and with return_lse=True of lse, (B, Hq,
    local rows)), float32 (float64 for float64 q) LSE.

    {options}
    """
    layout, lay = _layout(layout), _cp_layout(cp_layout)
    frame = _host_frame(q)
    vq, vk, vv = frame.view(q, "q"), frame.view(k, "k"), frame.view(v, "v")
    tq, tk, tv = vq.tensor(layout, "q"), vk.tensor(layout, "k"), vv.tensor(layout, "v")
    call = _Call(frame, tq.heads, opts)
    out, to, lse, tl = _dense_outputs(frame, vq, tq, vv.shape[3], layout, return_lse)
    _lib("fa_cp_forward")  # declared (and present) before the call
    call.run("fa_cp_forward", _comm(comm), lay,
             byref(call.params), byref(tq), byref(tk), byref(tv), byref(to),
             byref(tl) if tl is not None else None)
    return _forward_results(frame, out, lse)


@_options("score dropout backend isa threads")
def attention_backward(dout, q, k, v, out, lse, *, comm, cp_layout: str = "zigzag",
                       layout: str = "bshd", **opts):
    """flashattn.attention_backward over the whole sequence (fa_cp_backward): this rank's
    (dq, dk, dv), and with `sinks` dsinks, the whole sequence's, on every rank. out and lse
    are attention()'s with the same options.

    {options}
    """
    lay = _cp_layout(cp_layout)
    frame = _host_frame(q)
    call, tensors, results = _backward_operands(frame, _layout(layout), dout, q, k, v, out, lse,
                                               opts)
    _lib("fa_cp_backward")
    call.run("fa_cp_backward", _comm(comm), lay, byref(call.params), *map(byref, tensors))
    return _grad_results(frame, *results)
