"""The oracle: a candidate kernel's results against the float64 reference, under the
tolerance rule of docs/DESIGN.md §4 (fa_compare) and a kernel family's conventions (the
library's convention profiles, fa_profile_find), as ``flashattn check`` does."""
from __future__ import annotations

import math
from ctypes import byref, c_int
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import numpy as np

from . import _native as N
from ._api import (_Call, _indices, _int64, _kv_layout, _layout, _lse_dtype, _options, _packed,
                   _packed_lse, _pages, dtype_arg)
from ._arrays import NUMPY_DTYPES, STORED, Frame, View, host_view, numpy_dtype, to_host

_NAMES = ("out", "lse", "dq", "dk", "dv")
_DIM_WORDS = {"batch": "batch", "seq": "seqlen", "head": "heads", "dim": "headdim"}
_SIZE = {N.F64: 8, N.F32: 4, N.F16: 2, N.BF16: 2}  # bytes per element


@dataclass
class TensorReport:
    """One candidate tensor against the reference (fa_comparison). rel_error is max_abs over
    the tensor's largest finite |reference| (None where that is 0). worst_index is in the
    candidate array's own index order, index_names naming each index ("batch", "seq", "head",
    "dim": (batch, seq, head, dim) for layout "bshd", (batch, head, seq) for an LSE), as
    ``flashattn check --json`` writes them."""

    name: str
    passed: bool
    max_abs: float
    rel_error: Optional[float]
    nmse: float
    worst_index: Tuple[int, ...]
    index_names: Tuple[str, ...]
    worst_candidate: float
    worst_reference: float
    nonfinite_mismatches: int
    bound: float
    baseline_error: float
    rule: str
    # the statistics beside the max rule (docs/DESIGN.md §4): name -> (value, bound, passed);
    # "scale" is held as |scale - 1| <= bound. Bounds are inf where they are not judged
    # (rule="max", or atol/rtol).
    statistics: Dict[str, Tuple[float, float, bool]] = field(default_factory=dict)

    def __str__(self) -> str:
        at = "[" + ",".join(f"{n[0]}={i}" for n, i in zip(self.index_names,
                                                          self.worst_index)) + "]"
        rel = "-" if self.rel_error is None else f"{self.rel_error:.3g}"
        return (f"{self.name:<4} {'PASS' if self.passed else 'FAIL':<7} {self.max_abs:10.3g} "
                f"{rel:>10} {self.nmse:10.3g} {at:<22} {self.worst_candidate:13.6g} "
                f"{self.worst_reference:13.6g} {self.nonfinite_mismatches:9d}\n"
                f"     rule: {self.rule}\n"
                "     stats:" + ",".join(
                    f" {k} {v:{'.6g' if k == 'scale' else '.3g'}} "
                    f"({'1 +-' if k == 'scale' else '<='} {b:.3g}){'' if ok else ' FAILED'}"
                    for k, (v, b, ok) in self.statistics.items()))


@dataclass
class CheckReport:
    """What flashattn.check found: a verdict per candidate tensor and one for all. True in a
    boolean context when every tensor passes; str() is a table like ``flashattn check``'s."""

    passed: bool
    profile: str
    storage_dtype: str
    explicit_rule: bool
    tensors: Dict[str, TensorReport] = field(default_factory=dict)
    hint: Optional[str] = None  # what to try after a FAIL that may be the dtype's (dtype=)

    def __bool__(self) -> bool:
        return self.passed

    def __getitem__(self, name: str) -> TensorReport:
        return self.tensors[name]

    def __str__(self) -> str:
        head = ("reference float64; explicit tolerance" if self.explicit_rule else
                f"reference float64; yardstick conventional {self.storage_dtype}")
        lines = [f"flashattn check: {head}; profile {self.profile}",
                 f"{'':<4} {'verdict':<7} {'max abs':>10} {'rel err':>10} {'nmse':>10} "
                 f"{'worst index':<22} {'candidate':>13} {'reference':>13} {'nan/inf':>9}"]
        lines += [str(t) for t in self.tensors.values()]
        lines.append(f"verdict: {'PASS' if self.passed else 'FAIL'}")
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)


def profile_names() -> Tuple[str, ...]:
    """The convention profiles the library knows (README.md, "Convention profiles")."""
    names, i = [], 0
    while True:
        p = N.lib.fa_profile_at(i)
        if not p:
            return tuple(names)
        names.append(p.contents.name.decode())
        i += 1


def _profile(name: str):
    p = N.lib.fa_profile_find(name.encode()) if isinstance(name, str) else None
    if not p:
        raise N.InvalidArgumentError(f"profile={name!r}: expected one of "
                                     f"{', '.join(profile_names())}", N.FA_ERR_INVALID_ARGUMENT)
    return p


class _Host:
    """An array copied to the host with its storage dtype (bfloat16 as uint16 bits where
    ml_dtypes is absent), and views of it in any dtype."""

    def __init__(self, x, name: str):
        a, code = to_host(x, name)
        self.name = name
        self.dtype = code if code is not None else NUMPY_DTYPES.get(a.dtype)
        if self.dtype is None:
            raise TypeError(f"{name}: dtype {a.dtype} is not one the library stores ({STORED})")
        self.array = a

    def view(self) -> View:
        return host_view(self.array, self.dtype, self.name)

    def converted(self, dtype: int, then: Optional[int] = None) -> np.ndarray:
        """A contiguous copy in `dtype` (fa_convert: exact widening, one rounding down), as
        host storage (bfloat16 as uint16); with `then`, that copy converted again to `then`
        (the values rounded to dtype, widened)."""
        src = np.ascontiguousarray(self.array)
        dst = _host_empty(src.shape, dtype)
        N.check_status(N.lib.fa_convert(src.ctypes.data, self.dtype, dst.ctypes.data, dtype,
                                        src.size), f"{self.name}: convert")
        if then is None:
            return dst
        wide = _host_empty(src.shape, then)
        N.check_status(N.lib.fa_convert(dst.ctypes.data, dtype, wide.ctypes.data, then,
                                        src.size), f"{self.name}: convert")
        return wide


def _host_empty(shape, dtype: int) -> np.ndarray:
    """Host storage for `dtype` (bfloat16 as uint16)."""
    return np.empty(shape, dtype=np.uint16 if dtype == N.BF16 else numpy_dtype(dtype))


class _Shape:
    """How the call's tensors map to fa_tensors: dense (layout), varlen or paged."""

    def __init__(self, layout: str, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k,
                 kv_layout: str):
        self.varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
        self.paged = block_table is not None or seqused_k is not None
        if self.varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
            raise N.InvalidArgumentError("cu_seqlens_q and cu_seqlens_k: give both or neither",
                                         N.FA_ERR_INVALID_ARGUMENT)
        if self.paged and (block_table is None or seqused_k is None):
            raise N.InvalidArgumentError("block_table and seqused_k: give both or neither",
                                         N.FA_ERR_INVALID_ARGUMENT)
        if self.varlen and self.paged:
            raise N.InvalidArgumentError("cu_seqlens_* with block_table: a variable-length q "
                                         "over pages is not supported",
                                         N.FA_ERR_UNSUPPORTED)
        self.layout = _layout(layout)
        self.kv = _kv_layout(kv_layout) if self.paged else self.layout
        self.cu = (cu_seqlens_q, cu_seqlens_k)
        self.pages = (block_table, seqused_k)

    def qt(self, v: View, name: str) -> N.Tensor:
        return _packed(v, name) if self.varlen else v.tensor(self.layout, name)

    def kt(self, v: View, name: str) -> N.Tensor:
        return _packed(v, name) if self.varlen else v.tensor(self.kv, name)

    def lt(self, v: View) -> N.Tensor:
        return _packed_lse(v) if self.varlen else v.lse_tensor("lse")

    def lse_shape(self, tq: N.Tensor) -> tuple:
        return (tq.heads, tq.seqlen) if self.varlen else (tq.batch, tq.heads, tq.seqlen)

    def out_rows(self, rows: np.ndarray) -> np.ndarray:
        """A per-row array shaped as the LSE, in out's index order with a dim of 1 last."""
        return (rows if self.layout == "bhsd" and not self.varlen
                else np.swapaxes(rows, -1, -2))[..., None]

    def index_names(self, name: str) -> Tuple[str, ...]:
        """The candidate array's dims, in its own order (dk and dv are laid out as q: a paged
        K/V has no gradients)."""
        if name == "lse":
            return ("head", "seq") if self.varlen else ("batch", "head", "seq")
        if self.varlen:
            return ("seq", "head", "dim")
        return (("batch", "head", "seq", "dim") if self.layout == "bhsd" else
                ("batch", "seq", "head", "dim"))

    def index(self, name: str, worst) -> Tuple[int, ...]:
        """fa_comparison's [batch, seq, head, dim] in the candidate array's own order."""
        at = dict(zip(("batch", "seq", "head", "dim"), (int(x) for x in worst)))
        return tuple(at[n] for n in self.index_names(name))

    def dims(self, name: str) -> str:
        """The candidate array's dims in words, for messages."""
        words = ("total" if n == "seq" and self.varlen else _DIM_WORDS[n]
                 for n in self.index_names(name))
        return "(" + ", ".join(words) + ")"


def _run_all(shape: _Shape, call: _Call, ins: Dict[str, View], grads: bool,
             dtype: int) -> Dict[str, np.ndarray]:
    """Forward (and backward) of one backend on inputs already in `dtype`; host results."""
    tq, tk, tv = shape.qt(ins["q"], "q"), shape.kt(ins["k"], "k"), shape.kt(ins["v"], "v")
    res, views = {}, {}
    out_shape = tuple(ins["q"].shape[:-1]) + (ins["v"].shape[-1],)
    res["out"] = _host_empty(out_shape, dtype)
    res["lse"] = _host_empty(shape.lse_shape(tq), _lse_dtype(dtype))
    views["out"] = host_view(res["out"], dtype, "out")
    views["lse"] = host_view(res["lse"], _lse_dtype(dtype), "lse")
    to, tl = shape.qt(views["out"], "out"), shape.lt(views["lse"])
    p = byref(call.params)
    if shape.varlen:
        (kq, iq), (kk, ik) = (_indices(shape.cu[0], "cu_seqlens_q"),
                              _indices(shape.cu[1], "cu_seqlens_k"))
        call.run("fa_forward_varlen", p, byref(tq), byref(tk), byref(tv), byref(iq), byref(ik),
                 byref(to), byref(tl))
    elif shape.paged:
        keep, pages = _pages(*shape.pages)
        call.run("fa_forward_paged", p, byref(tq), byref(tk), byref(tv), byref(pages),
                 byref(to), byref(tl))
    else:
        call.run("fa_forward", p, byref(tq), byref(tk), byref(tv), byref(to), byref(tl))
    if not grads:
        return res
    tg = shape.qt(ins["dout"], "dout")
    tgrads = []
    for n, src in (("dq", "q"), ("dk", "k"), ("dv", "v")):
        res[n] = _host_empty(ins[src].shape, dtype)
        views[n] = host_view(res[n], dtype, n)
        tgrads.append(shape.qt(views[n], n) if n == "dq" else shape.kt(views[n], n))
    if shape.varlen:
        call.run("fa_backward_varlen", p, byref(tq), byref(tk), byref(tv), byref(iq), byref(ik),
                 byref(to), byref(tl), byref(tg), *map(byref, tgrads))
    else:
        call.run("fa_backward", p, byref(tq), byref(tk), byref(tv), byref(to), byref(tl),
                 byref(tg), *map(byref, tgrads))
    return res


@_options("score dropout bias fp8 threads", profile=True)
def check(q, k, v, *, out=None, lse=None, dq=None, dk=None, dv=None, dout=None,
          profile: str = "flashattn", dtype: Optional[str] = None, atol: Optional[float] = None,
          rtol: Optional[float] = None, rule: str = "all", layout: str = "bshd", cu_seqlens_q=None,
          cu_seqlens_k=None, block_table=None, seqused_k=None, kv_layout: str = "nhd",
          **opts) -> CheckReport:
    """Checks a candidate kernel's results (out, lse, dq, dk, dv: any of them) for the inputs
    q, k, v (and dout, the cotangent, for gradients) against the float64 reference, as
    ``flashattn check`` does: with no atol/rtol, each tensor's max error must be within
    2x (3x for gradients) the conventional path's error in the candidate's storage dtype on
    the same inputs, plus eps(dtype) x max(1, |ref|); with atol or rtol, every element within
    atol + rtol |ref|. NaN and inf must match exactly. Beside the max rule, four statistics of
    the errors (bias, least-squares scale, RMS error, decorrelation), each held to the
    yardstick's (docs/DESIGN.md §4), catch what a 16-bit dtype's noise hides from the max (a
    truncating conversion, a 0.5% scale, a dropped key block); rule="max" judges the max
    alone. The LSE is held to its own dtype: a 16-bit kernel's float32 (or float64) LSE is
    judged against the conventional path in float32 on the inputs rounded to 16 bits, with
    allowances for a cheap exp and tensor cores' accumulation (fa_lse_rule, docs/DESIGN.md
    §4). Returns a CheckReport (true when every tensor passes; print it for the table).

    FP8 inputs (q, k and v of one FP8 format, with descale_q, descale_k, descale_v as
    flashattn.attention takes them): the reference reads the same FP8 values (float64 out)
    and the yardstick is the conventional path on them (P rounded to V's format, as
    FlashAttention-3), its out in the candidate's dtype (default: its out's, else bfloat16).
    An FP8 K/V under wider q is not checked (UnsupportedError).

    Arrays of any framework (GPU ones are copied to the host for the reference). dtype: the
    candidate's storage dtype ("float16", "bfloat16", "float32", "float64"; default: that of
    its first output, else q's). profile: a kernel family's conventions ("flashattn",
    "fa2", "fa3", "pytorch", "flashinfer", "xformers", "ggml", "flex"): its causal alignment
    and ALiBi/softcap order unless align / score_order say otherwise, its LSE's base and
    empty-row value, its O of a row with no allowed key (0, NaN, or not compared), where its
    bias enters and whether its ALiBi slopes scale the bias (ggml; with attn_mask and
    alibi_slopes) unless bias_place / bias_by_slope say otherwise, and, for xformers and
    ggml, an int window counting keys (W: window (W - 1, 0)). The inputs may be a
    variable-length batch (cu_seqlens_q, cu_seqlens_k; packed (total, H, D) arrays, lse (H,
    total)) or a paged K/V (block_table, seqused_k, kv_layout; forward only). The options are
    flashattn.attention's (attn_mask and block_mask: dense only):

    {options}
    """
    for name, x in (("atol", atol), ("rtol", rtol)):
        if x is not None and not (math.isfinite(x) and x >= 0):
            raise N.InvalidArgumentError(f"{name}={x!r}: expected a finite value >= 0",
                                         N.FA_ERR_INVALID_ARGUMENT)
    if rule not in ("all", "max"):
        raise N.InvalidArgumentError(f"rule={rule!r}: expected 'all' (the max and the "
                                     "statistics) or 'max'", N.FA_ERR_INVALID_ARGUMENT)
    cands = {n: x for n, x in zip(_NAMES, (out, lse, dq, dk, dv)) if x is not None}
    if not cands:
        raise N.InvalidArgumentError("give at least one candidate: out, lse, dq, dk or dv",
                                     N.FA_ERR_INVALID_ARGUMENT)
    pfp = _profile(profile)
    pf = pfp.contents
    grads = any(n in cands for n in ("dq", "dk", "dv"))
    shape = _Shape(layout, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, kv_layout)
    if grads and dout is None:
        raise N.InvalidArgumentError("dq, dk, dv: gradient candidates need dout, the cotangent",
                                     N.FA_ERR_INVALID_ARGUMENT)
    if grads and shape.paged:
        raise N.InvalidArgumentError("dq, dk, dv: a paged K/V is forward only",
                                     N.FA_ERR_UNSUPPORTED)
    if "lse" in cands and not pf.has_lse:
        raise N.InvalidArgumentError(f"lse: profile {profile}: these kernels return no LSE",
                                     N.FA_ERR_INVALID_ARGUMENT)
    window = opts.get("window")  # one number: the profile's (a key count, or the left bound)
    number = _int64(window, "window") if isinstance(window, (int, np.integer)) else None
    if number is not None:
        del opts["window"]

    inputs = {"q": q, "k": k, "v": v}
    if grads:
        inputs["dout"] = dout
    hin = {n: _Host(x, n) for n, x in inputs.items()}
    hc = {n: _Host(x, n) for n, x in cands.items()}
    fp8 = hin["q"].dtype in N.FP8
    if hin["k"].dtype in N.FP8 and not fp8:
        raise N.UnsupportedError("k, v: an FP8 K/V under wider q is not checked (the float64 "
                                 "reference and the FP8 yardstick need FP8 q)",
                                 N.FA_ERR_UNSUPPORTED)
    _check_dtypes(hin)
    tq, tk = shape.qt(hin["q"].view(), "q"), shape.kt(hin["k"].view(), "k")
    tv = shape.kt(hin["v"].view(), "v")
    _check_shapes(shape, tq, tk, tv, shape.qt(hin["dout"].view(), "dout") if grads else None)
    want = {"out": tuple(hin["q"].array.shape[:-1]) + (hin["v"].array.shape[-1],),
            "lse": shape.lse_shape(tq), "dq": tuple(hin["q"].array.shape),
            "dk": tuple(hin["k"].array.shape), "dv": tuple(hin["v"].array.shape)}
    for n, c in hc.items():
        _check_candidate_shape(shape, n, tuple(c.array.shape), want[n])
    dt_from = None  # the candidate whose dtype is the yardstick's
    if dtype is not None:
        dt = dtype_arg(dtype, "dtype")
    else:  # FP8: the out dtype's default as flashattn.attention's
        dt_from = next((n for n in hc if n != "lse"), None)
        dt = hc[dt_from].dtype if dt_from else N.BF16 if fp8 else hin["q"].dtype
    explicit = (atol or 0) > 0 or (rtol or 0) > 0
    host = Frame(np.empty(0), "host")  # the reference and the yardstick run on the host
    if opts.get("attn_mask") is not None:
        opts["attn_mask"] = to_host(opts["attn_mask"], "attn_mask")[0]

    def call(backend: str) -> _Call:  # the options as the profile's kernels mean them
        return _Call(host, tq.heads, opts, kv_shape=(tq.batch, tk.heads), backend=backend,
                     profile=(pfp, number))

    def inputs_in(d: int) -> Dict[str, View]:  # FP8 inputs as they are: out takes d
        return {n: h.view() if fp8 else host_view(h.converted(d), d, n) for n, h in hin.items()}

    ref = _run_all(shape, call("reference"), inputs_in(N.F64), grads, N.F64)
    base = None
    if not explicit:
        base = _run_all(shape, call("conventional"), inputs_in(dt), grads, dt)
    lse_dt, lse_tol = dt, N.Tolerance()  # the LSE's yardstick and allowances (fa_lse_rule)
    if "lse" in hc:
        y = c_int()
        N.check_status(N.lib.fa_lse_rule(pfp, dt, hc["lse"].dtype, int(fp8), byref(y),
                                         byref(lse_tol)), "lse: rule")
        lse_dt = y.value
    if base is not None and lse_dt != dt:  # a forward in lse_dt for the LSE alone, on the
        # inputs rounded to dt (the values the kernel saw), widened exactly
        ins = {n: host_view(h.converted(dt, then=lse_dt), lse_dt, n) for n, h in hin.items()}
        base["lse"] = _run_all(shape, call("conventional"), ins, False, lse_dt)["lse"]
    if "out" in cands and pf.empty_out != N.EMPTY_OUT_ZERO:  # before the LSE's conversion
        _out_as_candidate_writes_it(pf, shape, ref, base, hc["out"], dt)
    if "lse" in cands:
        _lse_as_candidate_writes_it(pf, ref, hc["lse"])
        if base is not None:
            _lse_as_candidate_writes_it(pf, base, hc["lse"])

    def tensor_of(v: View, n: str) -> N.Tensor:
        if n == "lse":
            return shape.lt(v)
        return shape.qt(v, n) if n in ("out", "dq") else shape.kt(v, n)

    storage = (f"{N.DTYPE_NAMES[hin['q'].dtype]} (out {N.DTYPE_NAMES[dt]})" if fp8
               else N.DTYPE_NAMES[dt])
    report = CheckReport(True, profile, storage, explicit)
    for n, c in hc.items():
        tc, tr = tensor_of(c.view(), n), tensor_of(host_view(ref[n], N.F64, n), n)
        tb = None
        if base is not None:
            tb = tensor_of(host_view(base[n], _lse_dtype(lse_dt) if n == "lse" else dt, n), n)
        lse = n == "lse"
        tol = N.Tolerance(3.0 if n in ("dq", "dk", "dv") else 2.0, atol or 0.0, rtol or 0.0,
                          int(rule == "max"), lse_tol.allowance if lse else 0.0,
                          lse_tol.allowance_rel if lse else 0.0)
        r = N.Comparison()
        N.check_status(N.lib.fa_compare(byref(tc), byref(tr),
                                        byref(tb) if tb is not None else None, byref(tol),
                                        byref(r)), f"{n}: compare")
        t = TensorReport(n, bool(r.pass_), r.max_abs,
                         r.max_abs / r.ref_max if r.ref_max > 0 else None,
                         r.nmse, shape.index(n, r.worst), shape.index_names(n), r.worst_cand,
                         r.worst_ref, int(r.nonfinite_mismatches), r.bound, r.baseline_err,
                         r.rule.decode(errors="replace"))
        t.statistics = {k: (val, bnd, not r.failed & bit) for k, val, bnd, bit in (
            ("bias", r.bias, r.bias_bound, N.CMP_BIAS),
            ("scale", r.scale, r.scale_bound, N.CMP_SCALE),
            ("rms", r.rms, r.rms_bound, N.CMP_RMS),
            ("decorrelation", r.decorr, r.decorr_bound, N.CMP_DECORR))}
        report.tensors[n] = t
        report.passed &= t.passed
    # a FAIL against the yardstick of a candidate's dtype, wider than the inputs': a kernel that
    # computes in the inputs' dtype and returned its output wider was held to the wider rule
    qt = hin["q"].dtype
    if (not report.passed and dt_from and not explicit and not fp8
            and _SIZE.get(dt, 0) > _SIZE.get(qt, 8)):
        report.hint = (f"{dt_from} holds {N.DTYPE_NAMES[dt]} but q, k, v hold "
                       f"{N.DTYPE_NAMES[qt]}, so the yardstick ran in {N.DTYPE_NAMES[dt]}; if "
                       f"the kernel computes in {N.DTYPE_NAMES[qt]}, pass "
                       f"dtype={N.DTYPE_NAMES[qt]!r}")
    return report


def _check_dtypes(hin: Dict[str, "_Host"]) -> None:
    """q, k, v (and dout) share one dtype, but for a float16 or bfloat16 K/V cache under
    float32 or bfloat16 q (as ``flashattn check``); the one at fault is named."""
    q, k, v = hin["q"].dtype, hin["k"].dtype, hin["v"].dtype
    one = ("q, k and v share one dtype, but for a float16 or bfloat16 K/V cache under float32 "
           "or bfloat16 q")
    bad = None
    if v != k:
        bad = ("k", "q", one) if v == q else ("v", "k", "k and v share one dtype")
    elif k != q and not (k in (N.F16, N.BF16) and q in (N.F32, N.BF16)):
        bad = ("k", "q", one)
    elif "dout" in hin and hin["dout"].dtype != q:
        bad = ("dout", "q", "dout has q's dtype")
    if bad:
        x, ref, why = bad
        raise N.InvalidArgumentError(f"{x}: {N.DTYPE_NAMES[hin[x].dtype]}, but {ref} is "
                                     f"{N.DTYPE_NAMES[hin[ref].dtype]} ({why})", N.FA_ERR_DTYPE)


def _check_shapes(shape: _Shape, q: N.Tensor, k: N.Tensor, v: N.Tensor,
                  dout: Optional[N.Tensor]) -> None:
    """The inputs' dims agree, or InvalidArgumentError names the one at fault in its array's
    terms, as ``flashattn check`` does (cli_check_inputs): "k: head dim 32, but q has 64". Of q,
    k and v, the one whose batch the other two do not share is at fault; of k and v, the one
    whose heads do not divide q's; where nothing tells, v against k and k against q."""
    t = {"q": q, "k": k, "v": v, "dout": dout}
    pages = shape.paged

    def words(x: str, d: str) -> str:
        n = getattr(t[x], d)
        if d == "batch":
            return f"{n} pages" if pages and x in ("k", "v") else f"batch {n}"
        if d == "seqlen":
            return (f"page size {n}" if pages and x in ("k", "v") else
                    f"total length {n}" if shape.varlen else f"sequence length {n}")
        return f"{n} head{'s' if n != 1 else ''}" if d == "heads" else f"head dim {n}"

    def blame(x: str, ref: str, d: str, why: str = ""):
        raise N.InvalidArgumentError(f"{x}: {words(x, d)}, but {ref} has {getattr(t[ref], d)}"
                                     + (f" ({why})" if why else ""), N.FA_ERR_SHAPE)

    if pages and v.batch != k.batch:
        blame("v", "k", "batch", "k and v are pages of one cache")
    if not pages and not shape.varlen:
        kb, vb = k.batch == q.batch, v.batch == q.batch
        if not kb and not vb and k.batch == v.batch:
            blame("q", "k", "batch")
        if not kb:
            blame("k", "q", "batch")
        if not vb:
            blame("v", "q", "batch")
    if k.seqlen != v.seqlen:
        blame("v", "k", "seqlen", "k and v are pages of one cache" if pages else
              "k and v hold the same keys")
    if k.heads != v.heads:  # the one whose heads do not divide q's
        k_at_fault = v.heads > 0 and q.heads % v.heads == 0 and not (
            k.heads > 0 and q.heads % k.heads == 0)
        blame(*(("k", "v") if k_at_fault else ("v", "k")), "heads", "k and v share their heads")
    if k.heads > 0 and q.heads % k.heads:
        raise N.InvalidArgumentError(f"q: {q.heads} heads, not a multiple of the {k.heads} of k "
                                     "(each K/V head serves a whole group of query heads)",
                                     N.FA_ERR_SHAPE)
    if k.headdim != q.headdim:
        blame("k", "q", "headdim", "q and k share their head dim")
    if dout is None:
        return
    why = "dout is shaped as out: q's batch, sequence length and heads, v's head dim"
    for d in ("batch", "seqlen", "heads"):
        if getattr(dout, d) != getattr(q, d):
            blame("dout", "q", d, why)
    if dout.headdim != v.headdim:
        blame("dout", "v", "headdim", why)


def _check_candidate_shape(shape: _Shape, name: str, got: tuple, want: tuple) -> None:
    """A candidate of another shape than the inputs give it is refused, in its array's terms
    (an LSE saved as (batch, seqlen, heads) is told so)."""
    if got == want:
        return
    src = {"dq": "q", "dk": "k", "dv": "v"}.get(name, "the inputs")
    msg = f"{name}: shape {got}, but {src} give{'s' if name[0] == 'd' else ''} {want}"
    msg += f", {shape.dims(name)}"
    if name == "lse" and len(got) == len(want) and got[-2:] == want[-2:][::-1] and \
            got[:-2] == want[:-2]:
        msg += ("; it looks like (total, heads): pass lse.T" if shape.varlen else
                "; it looks like (batch, seqlen, heads): pass lse.transpose(0, 2, 1)")
    raise N.InvalidArgumentError(msg, N.FA_ERR_SHAPE)


def _lse_as_candidate_writes_it(pf, res: Dict[str, np.ndarray], cand: _Host) -> None:
    """A reference's (or yardstick's) LSE in the profile's convention (fa_lse_to_profile),
    and, where the profile's kernels write no defined value for an empty row, the candidate's
    own value there, so that those rows are not compared (as ``flashattn check``)."""
    a = res["lse"]
    v = host_view(a, N.F64 if a.dtype == np.float64 else N.F32, "lse")
    t = v.lse_tensor("lse") if a.ndim == 3 else _packed_lse(v)
    N.check_status(N.lib.fa_lse_to_profile(byref(pf), byref(t)), "lse")
    if pf.empty_lse == N.EMPTY_LSE_ANY:
        c = cand.converted(N.F64)
        res["lse"] = np.where(a == -math.inf, c, a).astype(a.dtype)


def _out_as_candidate_writes_it(pf, shape: _Shape, ref: Dict[str, np.ndarray],
                                base: Optional[Dict[str, np.ndarray]], cand: _Host,
                                dtype: int) -> None:
    """The reference's O of a row with no allowed key (its LSE -inf) as the profile's kernels
    write it: NaN, or, where they write no defined value, the candidate's own row in the
    reference and the yardstick, so that those rows are not compared."""
    empty = shape.out_rows(ref["lse"] == -math.inf)
    if pf.empty_out == N.EMPTY_OUT_NAN:
        ref["out"] = np.where(empty, np.nan, ref["out"])
        return
    ref["out"] = np.where(empty, cand.converted(N.F64), ref["out"])
    if base is not None:
        base["out"] = np.where(empty, cand.converted(dtype), base["out"])
