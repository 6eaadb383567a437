"""The library's entry points with Python names and defaults (include/flashattn.h is the
contract; docs/DESIGN.md §1 the semantics)."""
from __future__ import annotations

import ctypes
import functools
import inspect
import operator
import textwrap
from ctypes import byref
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native as N
from ._arrays import Frame, View, float_vector, host_floats, index_array

Window = Union[None, int, Tuple[int, int]]

#: The tensors of the last call, as the library received them (fa_tensor structs, by role):
#: what the tests read to prove that the library read the caller's own buffers.
last_call: dict = {}

# ------------------------------------------------------------------ shared pieces


def _layout(layout: str, name: str = "layout") -> str:
    if layout not in ("bshd", "bhsd"):
        raise N.InvalidArgumentError(f"{name}={layout!r}: expected 'bshd' (batch, seq, heads, "
                                     "dim) or 'bhsd' (batch, heads, seq, dim)",
                                     N.FA_ERR_INVALID_ARGUMENT)
    return layout


def _int64(x, name: str) -> int:
    """An int that fits the C int64 it goes to (ctypes would wrap a larger one)."""
    try:
        v = operator.index(x)
    except TypeError:
        raise N.InvalidArgumentError(f"{name}={x!r}: expected an int",
                                     N.FA_ERR_INVALID_ARGUMENT) from None
    if not -(1 << 63) <= v < 1 << 63:
        raise N.InvalidArgumentError(f"{name}={x!r}: out of the int64 range",
                                     N.FA_ERR_INVALID_ARGUMENT)
    return v


def _window(window: Window) -> Tuple[int, int]:
    if window is None:
        return -1, -1
    if isinstance(window, (int, np.integer)):
        return _int64(window, "window"), -1
    try:
        left, right = window
    except (TypeError, ValueError):
        raise N.InvalidArgumentError(f"window={window!r}: expected None, an int (the left "
                                     "bound) or a pair (left, right), -1 for unbounded",
                                     N.FA_ERR_INVALID_ARGUMENT) from None
    return _int64(left, "window[0]"), _int64(right, "window[1]")


def _choice(table: dict, value: str, name: str) -> int:
    if value not in table:
        raise N.InvalidArgumentError(f"{name}={value!r}: expected one of "
                                     f"{', '.join(map(repr, table))}", N.FA_ERR_INVALID_ARGUMENT)
    return table[value]


#: dtype names: numpy's and the command's (--dtype, --out-dtype)
DTYPE_BY_NAME = {"float32": N.F32, "float64": N.F64, "float16": N.F16, "bfloat16": N.BF16,
                 "f32": N.F32, "f64": N.F64, "f16": N.F16, "bf16": N.BF16}


def dtype_arg(x, name: str) -> int:
    """The fa_dtype of a dtype argument: a name ("bfloat16", "bf16"), a numpy dtype (ml_dtypes'
    bfloat16 too) or a torch dtype."""
    try:
        key = x if isinstance(x, str) else np.dtype(x).name
    except TypeError:
        key = str(x).replace("torch.", "")
    if key not in DTYPE_BY_NAME:
        raise N.InvalidArgumentError(f"{name}={x!r}: expected one of "
                                     f"{', '.join(DTYPE_BY_NAME)}", N.FA_ERR_INVALID_ARGUMENT)
    return DTYPE_BY_NAME[key]


def _out_dtype(q_dtype: int, out_dtype) -> int:
    """out's dtype: q's, or for FP8 q out_dtype's (default bfloat16, FlashAttention-3's)."""
    if q_dtype in N.FP8:
        return N.BF16 if out_dtype is None else dtype_arg(out_dtype, "out_dtype")
    if out_dtype is not None and dtype_arg(out_dtype, "out_dtype") != q_dtype:
        raise N.InvalidArgumentError(f"out_dtype={out_dtype!r}: out takes q's dtype "
                                     f"({N.DTYPE_NAMES[q_dtype]}); out_dtype is for FP8 q",
                                     N.FA_ERR_DTYPE)
    return q_dtype


_DESCALES = ("descale_q", "descale_k", "descale_v")


def _descales(values, batch: int, kv_heads: int):
    """The descale factors given (None where not) as float32 host arrays, and their layout:
    a number or a 0-d / 1-element array each (per tensor), or (B, Hk) each (per kv head)."""
    arrays, layouts = [], set()
    for name, x in zip(_DESCALES, values):
        a = None if x is None else host_floats(x, name)
        arrays.append(a)
        if a is None:
            continue
        if a.shape == (batch, kv_heads):
            layouts.add(N.DESCALE_PER_KV_HEAD)
        elif a.size == 1 and a.ndim <= 1:
            layouts.add(N.DESCALE_PER_TENSOR)
        else:
            raise N.InvalidArgumentError(
                f"{name}: expected a number or a 1-element array (per tensor) or shape "
                f"({batch}, {kv_heads}) (B, Hk: per kv head), got shape {a.shape}",
                N.FA_ERR_SHAPE)
    if len(layouts) > 1:
        raise N.InvalidArgumentError("descale_q, descale_k, descale_v: one layout for all, per "
                                     "tensor or per kv head (B, Hk), not a mix",
                                     N.FA_ERR_INVALID_ARGUMENT)
    return arrays, layouts.pop() if layouts else N.DESCALE_PER_TENSOR


def _mask_view(frame: Frame, attn_mask) -> View:
    """attn_mask's view, its key axis contiguous: a row-major copy where it is not (a stride
    other than 1, a broadcast key axis) or where a stride is negative."""
    v = frame.view(attn_mask, "attn_mask", mask=True)
    if len(v.shape) > 4:
        raise N.InvalidArgumentError(f"attn_mask (the bias): expected at most 4 dims (B, H, Sq, "
                                     f"Sk), got shape {tuple(v.shape)}", N.FA_ERR_SHAPE)
    if (v.shape and v.shape[-1] > 1 and v.strides[-1] != 1) or min(v.strides, default=0) < 0:
        v = frame.view(frame.contiguous(attn_mask), "attn_mask", mask=True)
    return v


def _bias_tensor(v: View, name: str) -> N.Tensor:
    """The fa_tensor of a mask (or its gradient) in PyTorch SDPA's (B, H, Sq, Sk) order, fewer
    leading dims counting as 1 (broadcast, as the library broadcasts a dim of 1)."""
    n = 4 - len(v.shape)
    t = View(v.ptr, v.dtype, (1,) * n + tuple(v.shape), (0,) * n + tuple(v.strides), v.device,
             None).tensor("bhsd", name)
    if t.headdim <= 1:
        t.headdim_stride = 1  # a stride of one key or none is never read
    return t


@dataclass
class BlockMask:
    """A block-sparse mask in FlexAttention's BlockMask form (fa_block_mask): queries in blocks
    of q_block rows, keys in blocks of kv_block keys; query block r of (b, h) lists its key
    blocks in kv_indices[b, h, r, :kv_num_blocks[b, h, r]] and, where given, more in
    full_kv_indices[b, h, r, :full_kv_num_blocks[b, h, r]]. kv_num_blocks is (B|1, H|1, nq)
    and kv_indices (B|1, H|1, nq, nk), nq = ceil(Sq / q_block), nk = ceil(Sk / kv_block), the
    full lists the same shapes; int32 or int64 arrays of any framework (read on the host)."""

    kv_num_blocks: Any
    kv_indices: Any
    full_kv_num_blocks: Any = None
    full_kv_indices: Any = None
    q_block: int = 128
    kv_block: int = 128


_BLOCK_LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")


def _block_mask(bm):
    """block_mask (a BlockMask, or FlexAttention's, read by its attributes and BLOCK_SIZE) as
    host index arrays and the fa_block_mask over them."""
    try:
        lists = [getattr(bm, n) for n in _BLOCK_LISTS]
        sizes = (bm.q_block, bm.kv_block) if isinstance(bm, BlockMask) else bm.BLOCK_SIZE
        qb, kb = (sizes, sizes) if isinstance(sizes, int) else sizes
    except (AttributeError, TypeError, ValueError):
        raise N.InvalidArgumentError(
            f"block_mask: expected a flashattn.BlockMask or FlexAttention's BlockMask, got "
            f"{type(bm).__name__}", N.FA_ERR_INVALID_ARGUMENT) from None
    if lists[0] is None or lists[1] is None or (lists[2] is None) != (lists[3] is None):
        raise N.InvalidArgumentError("block_mask: kv_num_blocks and kv_indices are needed, "
                                     "full_kv_num_blocks and full_kv_indices both or neither",
                                     N.FA_ERR_INVALID_ARGUMENT)
    keep, ind = zip(*(_indices(x, f"block_mask.{n}") if x is not None else (None, N.Indices())
                      for n, x in zip(_BLOCK_LISTS, lists)))
    num, idx = keep[0], keep[1]
    if (num.ndim != 3 or idx.ndim != 4 or idx.shape[:3] != num.shape
            or any(a is not None and a.shape != b.shape for a, b in zip(keep[2:], keep))):
        raise N.InvalidArgumentError(
            "block_mask: expected kv_num_blocks (B|1, H|1, nq) and kv_indices (B|1, H|1, nq, "
            "nk), the full lists the same shapes; got " + ", ".join(
                f"{n} {a.shape}" for n, a in zip(_BLOCK_LISTS, keep) if a is not None),
            N.FA_ERR_SHAPE)
    return keep, N.BlockMask(num.shape[0], num.shape[1], _int64(qb, "block_mask q_block"),
                             _int64(kb, "block_mask kv_block"), *ind)


_DEFAULT_PARAMS = N.Params()
N.lib.fa_params_init(byref(_DEFAULT_PARAMS))

# ------------------------------------------------------------------ the options


class _Option(NamedTuple):
    """Keywords of the entry points that fill fa_params (or choose the context): one entry
    each, or one for keywords filled together. Adding an fa_params option is one entry in
    _OPTIONS (and its field in _native.Params); the entry points of its group take it, list
    it in their signatures and docstrings, and _Call fills it."""

    names: Tuple[str, ...]
    defaults: Tuple[Any, ...]
    group: str  # the entry points that take it: those whose _options() name the group
    doc: str  # its paragraph in their docstrings, from "name: "
    fill: Optional[Callable] = None  # fill(call, params, *values) (None: not a params option)
    given: int = 0  # its FA_GIVEN_ bit: check() leaves it to the profile where it is None


def _field(name: str, conv: Callable) -> Callable:
    """The fill of one plain fa_params field: p.<name> = conv(value)."""
    return lambda call, p, value: setattr(p, name, conv(value))


def _named(name: str, table: dict) -> Callable:
    """The fill of an enum field given by its names (table: name -> value)."""
    return _field(name, lambda v: _choice(table, v, name))


def _fill_scale(call, p, scale):
    if not float(scale) > 0:
        raise N.InvalidArgumentError(f"scale={scale!r}: None for 1 / sqrt(D), else a finite "
                                     "value > 0", N.FA_ERR_INVALID_ARGUMENT)
    p.scale = float(scale)


def _fill_window(call, p, window):
    p.window_left, p.window_right = _window(window)


def _fill_stream(call, p, seed, offset):
    if not 0 <= int(seed) < 1 << 64 or not 0 <= int(offset) < 1 << 64:
        raise N.InvalidArgumentError(f"seed={seed}, offset={offset}: each in [0, 2^64)",
                                     N.FA_ERR_INVALID_ARGUMENT)
    p.dropout_seed, p.dropout_offset = int(seed), int(offset)


def _fill_slopes(call, p, slopes):
    call.slopes = float_vector(slopes, "alibi_slopes", call.hq)  # kept alive for the call
    if call.slopes is not None:
        p.alibi_slopes = call.slopes.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def _fill_sinks(call, p, sinks):
    call.sinks = float_vector(sinks, "sinks", call.hq)
    if call.sinks is not None:
        p.sink_logits = call.sinks.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def _fill_mask(call, p, attn_mask):
    call.mask = _mask_view(call.frame, attn_mask)
    call.bias = _bias_tensor(call.mask, "attn_mask")
    p.bias = ctypes.pointer(call.bias)


def _fill_blocks(call, p, block_mask):
    call.blocks = _block_mask(block_mask)
    p.block_mask = ctypes.pointer(call.blocks[1])


def _fill_descales(call, p, *values):
    call.descales, p.descale_layout = _descales(values, *call.kv_shape)
    for name, d in zip(_DESCALES, call.descales):
        if d is not None:
            setattr(p, name, d.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))


#: Every option keyword, in the docstrings' order. Groups: "score" every attention call's,
#: "dropout" the dense and varlen calls', "bias" the dense calls', "fp8" the dense forward's,
#: "backend", "isa", "threads" and "det" the context's.
_OPTIONS = (
    _Option(("causal",), (False,), "score", "causal: each query row sees keys up to its own "
            "position (aligned as `align` says).", _field("causal", lambda v: 1)),
    _Option(("align",), ("bottom-right",), "score", "align: where query row i sits among the "
            "keys when Sq != Sk: \"bottom-right\" (the last query row sees the last key: "
            "FlashAttention's convention) or \"top-left\" (PyTorch's).",
            _named("align", N.ALIGNS), N.GIVEN_ALIGN),
    _Option(("window",), (None,), "score", "window: None (no window), an int (the left bound: "
            "keys at most that many positions left of the row's own), or (left, right), -1 for "
            "unbounded on that side (FlashAttention's window_size).", _fill_window),
    _Option(("softcap",), (None,), "score", "softcap: None (off), or c > 0: scores become "
            "c tanh(s / c).", _field("softcap", float)),
    _Option(("alibi_slopes",), (None,), "score", "alibi_slopes: None, or one slope per query "
            "head (host or device array, float32).", _fill_slopes),
    _Option(("scale",), (None,), "score", "scale: None (1 / sqrt(D)), or the score scale.",
            _fill_scale),
    _Option(("dropout_p",), (0.0,), "dropout", "dropout_p: the probability of dropping each "
            "(row, key) term, from Philox(seed, offset) as docs/DESIGN.md §1 defines it (draws "
            "are this library's, not any other's).", _field("dropout_p", float)),
    _Option(("seed", "offset"), (0, 0), "dropout", "seed, offset: the Philox stream's key and "
            "counter offset, each in [0, 2^64).", _fill_stream),
    _Option(("sinks",), (None,), "score", "sinks: None, or one logit per query head that joins "
            "every row's softmax denominator with no value (gpt-oss); a row with no allowed key "
            "then has LSE = the sink, O = 0.", _fill_sinks),
    _Option(("sink_tokens",), (0,), "score", "sink_tokens: the first n keys stay visible beside "
            "a sliding window (StreamingLLM).",
            _field("sink_tokens", lambda v: _int64(v, "sink_tokens"))),
    _Option(("score_order",), ("softcap-then-alibi",), "score", "score_order: "
            "\"softcap-then-alibi\" (FlashAttention-2, ggml) or \"alibi-then-softcap\" "
            "(FlashInfer).",
            _named("score_order", N.SCORE_ORDERS), N.GIVEN_SCORE_ORDER),
    _Option(("attn_mask",), (None,), "bias", "attn_mask: None, or PyTorch SDPA's attn_mask: a "
            "bool keep-mask (True keeps the key) or an additive float bias (float64, float32, "
            "float16 or bfloat16, any of them under any q; -inf masks), shaped (B, H, Sq, Sk) "
            "whatever `layout` is (H: q's heads), or broadcastable to it: fewer leading dims "
            "((Sq, Sk), (H, Sq, Sk)) and dims of 1 or of stride 0 (np.broadcast_to, torch's "
            "expand) are read as broadcast, with no copy; the key axis must be Sk long, and is "
            "copied to a row-major array where its stride is not 1. A row it masks entirely "
            "has O = 0 and LSE = -inf (the sink's logit with sinks). Dense calls only (the "
            "calls of sequences do not take one).", _fill_mask),
    _Option(("bias_place",), ("after-scale",), "bias", "bias_place: where the bias enters the "
            "scores: \"after-scale\" (added to scale q.k, before softcap and ALiBi: SDPA, "
            "xformers) or \"after-softcap\" (after both: ggml).",
            _named("bias_place", N.BIAS_PLACES), N.GIVEN_BIAS_PLACE),
    _Option(("bias_by_slope",), (False,), "bias", "bias_by_slope: ggml's ALiBi: each head's "
            "slope multiplies the bias, and ALiBi's own distance term is dropped (needs "
            "attn_mask and alibi_slopes).", _field("bias_by_slope", lambda v: 1),
            N.GIVEN_BIAS_BY_SLOPE),
    _Option(("block_mask",), (None,), "bias", "block_mask: None, a flashattn.BlockMask, or "
            "FlexAttention's BlockMask (torch.nn.attention.flex_attention; its tensors are "
            "copied to the host): key j is allowed for row i only if j's key block is listed "
            "for i's query block, on top of the window and attn_mask (a listed block is a hint, "
            "never a permission: give FlexAttention's mask_mod as causal, window or attn_mask). "
            "Dense calls only.", _fill_blocks),
    _Option(_DESCALES, (None, None, None), "fp8", "descale_q, descale_k, descale_v: FP8 "
            "tensors only: the value an element c stands for is descale x c. A number or a "
            "1-element array each (per tensor), or (B, Hk) each (per batch and kv head, "
            "FlashAttention-3's layout; q head h takes kv head h // (Hq / Hk)); finite and > 0; "
            "one layout for all those given.", _fill_descales),
    _Option(("backend",), ("auto",), "backend", "backend: \"auto\" (CUDA for GPU arrays where it "
            "is built, else \"tiled\"), \"tiled\", \"reference\" (the float64 oracle), "
            "\"conventional\" (S and P materialized), \"cuda\"."),
    _Option(("isa",), ("auto",), "isa", "isa: the CPU kernel set: " + ", ".join(
        f'"{n}"' for n in N.ISAS) + " (the library's names, as FA_ISA's)."),
    _Option(("threads",), (0,), "threads", "threads: CPU threads (0: OpenMP's default); CPU "
            "results are the same bits for any count."),
    _Option(("deterministic",), (False,), "det", "deterministic: CUDA backend: a bitwise "
            "repeatable backward."),
)


_ORDER = {n: i for i, o in enumerate(_OPTIONS) for n in o.names}


def _unset(value, default) -> bool:
    """An option given as its default writes nothing: None for None, any false value for a
    false default, else the default's value."""
    return value is None if default is None else not value if not default else value == default


def _options(groups: str, profile: bool = False):
    """The decorated entry point takes the options of these groups (space-separated) as
    keywords: its **opts receives those given (an unknown keyword is a TypeError, as for any
    function; the others are at their defaults, which _Call leaves unwritten); its signature
    lists them all with their defaults and "{options}" in its docstring becomes their
    paragraphs. profile: check's: the options a profile decides default to None, the
    profile's (fa_profile_apply)."""
    taken = [o for o in _OPTIONS if o.group in groups.split()]
    defaults = {n: None if profile and o.given else d
                for o in taken for n, d in zip(o.names, o.defaults)}
    doc = "\n    ".join("\n    ".join(textwrap.wrap(
        o.doc + (" None (the default): the profile's." if profile and o.given else ""), 88,
        subsequent_indent="    ")) for o in taken)

    def wrap(f):
        sig = inspect.signature(f)
        own = [q for q in sig.parameters.values() if q.kind is not q.VAR_KEYWORD]
        known = defaults.keys() | {q.name for q in own}

        @functools.wraps(f)
        def entry(*args, **kw):
            if not known.issuperset(kw):
                raise TypeError(f"{f.__name__}() got an unexpected keyword argument "
                                f"{sorted(kw.keys() - known)[0]!r}")
            return f(*args, **kw)

        entry.__signature__ = sig.replace(parameters=own + [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
            for n, d in defaults.items()])
        entry.__doc__ = f.__doc__.replace("{options}", doc)
        return entry
    return wrap


class _Call:
    """What one call needs beside its tensors: the params struct (and the host arrays it
    points into), and the context for the arrays' framework, device and stream."""

    def __init__(self, frame: Frame, hq: int = 0, opts: Optional[dict] = None, *,
                 kv_shape: Tuple[int, int] = (0, 0), backend: Optional[str] = None,
                 profile=None):
        """opts: the option keywords given to the entry point (_options; the others are at
        their defaults), filled in _OPTIONS' order; kv_shape: (B, Hk), for descales per kv
        head; backend: the one to run, else opts'; profile: check's (fa_profile pointer, one
        window number or None): its conventions for the options left None
        (fa_profile_apply)."""
        opts = opts or {}
        self.frame, self.hq, self.kv_shape = frame, hq, kv_shape
        self.slopes = self.sinks = self.mask = self.bias = self.blocks = None
        self.descales = (None, None, None)
        # the defaults' fields are _DEFAULT_PARAMS's: only the others are written
        p = N.Params.from_buffer_copy(_DEFAULT_PARAMS)
        given = 0
        for i in sorted({_ORDER[n] for n in opts}):
            o = _OPTIONS[i]
            values = [opts.get(n, d) for n, d in zip(o.names, o.defaults)]
            if profile is not None and o.given:
                if values[0] is None:
                    continue
                given |= o.given
            if o.fill and not all(map(_unset, values, o.defaults)):
                o.fill(self, p, *values)
        if profile is not None:
            pf, window = profile
            w = None if window is None else byref(ctypes.c_int64(window))
            N.check_status(N.lib.fa_profile_apply(pf, byref(p), w, given), "check")
        self.params = p
        backend = backend or opts.get("backend", "auto")
        isa, threads = opts.get("isa", "auto"), opts.get("threads", 0)
        deterministic = opts.get("deterministic", False)
        if not frame.on_gpu:
            self.ctx = N.contexts.get(backend, isa, threads, 0, deterministic)
            return
        if backend not in ("auto", "cuda"):
            raise N.InvalidArgumentError(
                f"backend={backend!r}: the arrays are on a GPU, which only the 'cuda' backend "
                "reads ('auto' takes it)", N.FA_ERR_INVALID_ARGUMENT)
        with frame.guard():
            self.ctx = N.contexts.get("cuda", isa, threads, frame.stream, deterministic,
                                      frame.device[1])

    def run(self, fn: str, *args) -> None:
        """Calls the library's fn(context, *args) with the arrays' device current."""
        if not self.frame.on_gpu:
            N.check_status(getattr(N.lib, fn)(self.ctx, *args), fn[3:])
            return
        with self.frame.guard():
            N.check_status(getattr(N.lib, fn)(self.ctx, *args), fn[3:])

    def sink_grad(self) -> Optional[np.ndarray]:
        """A host buffer for d loss / d sink, wired into the params (None without sinks)."""
        if self.sinks is None:
            return None
        g = np.zeros_like(self.sinks)
        self.params.sink_grad = g.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        return g

    def bias_grad(self, dtype: int):
        """An array for d loss / d attn_mask in the mask's own shape, float32 (float64 for
        float64 storage), wired into the params."""
        if self.mask is None or self.mask.dtype == N.BOOL:
            raise N.InvalidArgumentError(
                "bias_grad=True: " + ("attn_mask is None: there is no bias to differentiate"
                                      if self.mask is None else "attn_mask is a bool keep-mask, "
                                      "which has no gradient (pass an additive float bias)"),
                N.FA_ERR_INVALID_ARGUMENT)
        g, vg = self.frame.empty(tuple(self.mask.shape), _lse_dtype(dtype), "bias_grad")
        self.dbias = _bias_tensor(vg, "bias_grad")
        self.params.bias_grad = ctypes.pointer(self.dbias)
        return g


def _lse_dtype(dtype: int) -> int:
    return N.F64 if dtype == N.F64 else N.F32


def _packed(view: View, name: str) -> N.Tensor:
    """The fa_tensor (1, total, H, D) of a packed (total, H, D) array."""
    if len(view.shape) != 3:
        raise N.InvalidArgumentError(f"{name}: expected 3 dims (total tokens, heads, dim), got "
                                     f"shape {view.shape}", N.FA_ERR_SHAPE)
    (t, h, d), (st, sh, sd) = view.shape, view.strides
    return N.Tensor(view.ptr, view.dtype, 1, t, h, d, 0, st, sh, sd)


def _packed_lse(view: View) -> N.Tensor:
    """The fa_tensor of a varlen LSE, (H, total) as FlashAttention returns it."""
    if len(view.shape) != 2:
        raise N.InvalidArgumentError(f"lse: expected 2 dims (heads, total tokens), got shape "
                                     f"{tuple(view.shape)}", N.FA_ERR_SHAPE)
    (h, t), (sh, st) = view.shape, view.strides
    return N.Tensor(view.ptr, view.dtype, 1, t, h, 1, 0, st, sh, 1)


def _dense_outputs(frame: Frame, vq: View, tq: N.Tensor, dv: int, layout: str,
                   return_lse: bool, out=None, out_dtype=None):
    """A forward's out (shaped and laid out like q, with head dim dv, in q's dtype or for
    FP8 q out_dtype's; the caller's `out` where given) and, with return_lse, its lse (B, Hq,
    Sq), with their fa_tensors (the lse's None without)."""
    dtype = _out_dtype(vq.dtype, out_dtype)
    if out is None:
        out, vo = frame.empty(tuple(vq.shape[:3]) + (dv,), dtype, "out")
    else:
        vo = frame.writable(out, "out")
        if out_dtype is not None and vo.dtype != dtype:
            raise N.InvalidArgumentError(f"out_dtype={out_dtype!r}: out is "
                                         f"{N.DTYPE_NAMES[vo.dtype]}", N.FA_ERR_DTYPE)
    lse = tl = None
    if return_lse:
        lse, vl = frame.empty((tq.batch, tq.heads, tq.seqlen), _lse_dtype(vo.dtype), "lse")
        tl = vl.lse_tensor("lse")
    return out, vo.tensor(layout, "out"), lse, tl


def _forward_results(frame: Frame, out, lse):
    """out, or (out, lse) where the call returns the LSE."""
    out = frame.result(out)
    return out if lse is None else (out, frame.result(lse))


def _grad_outputs(frame: Frame, views, tensor_of):
    """dq, dk, dv allocated like the views of q, k, v, and their fa_tensors (tensor_of(view,
    name))."""
    grads, tensors = [], []
    for x, n in zip(views, ("dq", "dk", "dv")):
        a, vg = frame.empty(x.shape, x.dtype, n)
        grads.append(a)
        tensors.append(tensor_of(vg, n))
    return grads, tensors


def _grad_results(frame: Frame, grads, dsinks, dbias=None):
    """(dq, dk, dv), dsinks after them where the call had sinks, and dbias where asked."""
    res = tuple(frame.result(a) for a in grads)
    res += (frame.from_host(dsinks),) if dsinks is not None else ()
    return res + (frame.result(dbias),) if dbias is not None else res


def _indices(x, name: str):
    a, kind = index_array(x, name)
    return a, N.Indices(a.ctypes.data, kind, a.size)


# ------------------------------------------------------------------ dense


_BLOCK_FORMATS = {"q8_0": N.Q8_0, "q4_0": N.Q4_0}


def _kv_blocks(kv_dtype) -> tuple:
    """k's and v's block formats from attention's kv_dtype (None, None where it is None)."""
    if kv_dtype is None:
        return None, None
    names = (kv_dtype, kv_dtype) if isinstance(kv_dtype, str) else kv_dtype
    try:
        k_fmt, v_fmt = (_BLOCK_FORMATS[n] for n in names)
    except (TypeError, ValueError, KeyError):
        raise N.InvalidArgumentError(f"kv_dtype={kv_dtype!r}: expected \"q8_0\", \"q4_0\" or a "
                                     "pair of them (k's, v's)", N.FA_ERR_DTYPE) from None
    return k_fmt, v_fmt


@_options("score dropout bias fp8 backend isa threads det")
def attention(q, k, v, *, layout: str = "bshd", return_lse: bool = False, out=None,
              out_dtype=None, kv_dtype=None, **opts):
    """Exact attention: out = softmax(scale q k^T + mask and biases) v (fa_forward).

    q is (B, Sq, Hq, D), k (B, Sk, Hk, D) and v (B, Sk, Hk, Dv) in layout "bshd" (the
    default, FlashAttention's), or (B, H, S, D) each in layout "bhsd" (PyTorch SDPA's); Hq a
    multiple of Hk (GQA, MQA). Arrays of numpy (ml_dtypes' bfloat16 too), PyTorch, JAX or
    CuPy, float64, float32, float16 or bfloat16, any strides with a contiguous head dim; k
    and v share a dtype: q's, or float16 / bfloat16 / FP8 under float32 or bfloat16 q (a KV
    cache). FP8 (float8_e4m3fn, float8_e5m2: ml_dtypes' or torch's; forward only): q, k and
    v all of one format (FlashAttention-3's FP8 forward; out in out_dtype, default bfloat16),
    or k and v alone under float32 / bfloat16 q. They are read where they lie (no copy); GPU
    arrays run on the CUDA backend, on the framework's current stream, where it is built (a
    JAX array on a GPU is copied to the host and back).

    Returns out, shaped and laid out like q with v's head dim, in q's framework and dtype
    (out_dtype for FP8 q; written into `out` where given), and with return_lse=True also lse,
    (B, Hq, Sq) float32 (float64 for a float64 out): the natural-log log-sum-exp of each
    row's scores, -inf for a row with no allowed key.

    {options}
    out_dtype: FP8 q only: out's dtype, "float32", "float16", "bfloat16" (the default) or
        "float64" (names, numpy or torch dtypes).
    kv_dtype: "q8_0" or "q4_0" (or a pair, k's and v's): k and v are uint8 arrays of ggml's
        blocks (llama.cpp's -ctk/-ctv cache), their last dim a row's bytes (D / 32 x 34 for
        q8_0, x 18 for q4_0; rows contiguous), under float32, float16 or bfloat16 q; forward
        only. The blocks' dequantized values are what attention reads (docs/DESIGN.md §1).

    Raises InvalidArgumentError (a ValueError) naming the argument for bad input, with
    nothing written; UnsupportedError, OutOfMemoryError, BackendUnavailableError, DeviceError.
    """
    layout = _layout(layout)
    k_fmt, v_fmt = _kv_blocks(kv_dtype)
    frame = Frame(q, "q")
    vq = frame.view(q, "q")
    vk, vv = frame.view(k, "k", block=k_fmt), frame.view(v, "v", block=v_fmt)
    tq, tk, tv = vq.tensor(layout, "q"), vk.tensor(layout, "k"), vv.tensor(layout, "v")
    call = _Call(frame, tq.heads, opts, kv_shape=(tq.batch, tk.heads))
    given = out is not None
    out, to, lse, tl = _dense_outputs(frame, vq, tq, vv.shape[3], layout, return_lse, out,
                                      out_dtype)
    last_call.update(q=tq, k=tk, v=tv, out=to, attn_mask=call.bias)
    call.run("fa_forward", byref(call.params), byref(tq), byref(tk), byref(tv),
             byref(to), byref(tl) if tl is not None else None)
    if given:
        frame.written(out)
    return _forward_results(frame, out, lse)


@_options("score dropout bias backend isa threads det")
def attention_backward(dout, q, k, v, out, lse, *, layout: str = "bshd", bias_grad: bool = False,
                       **opts):
    """Gradients of attention for the cotangent dout (fa_backward): (dq, dk, dv), with
    `sinks` also dsinks, d loss / d sink per query head (float32), and with bias_grad=True
    last dbias, d loss / d attn_mask in the mask's own shape as given (a broadcast dim
    receives the sum over it), float32 (float64 for float64 q); a bool keep-mask has none
    (InvalidArgumentError).

    out and lse are the forward's results with the same options (lse (B, Hq, Sq), float64
    for float64 q); dout is shaped like out. One storage dtype for q, k, v, out and dout.
    dk and dv of a GQA group sum over its query heads. The options must be the forward's:

    {options}
    """
    frame = Frame(q, "q")
    call, tensors, results = _backward_operands(frame, _layout(layout), dout, q, k, v, out, lse,
                                               opts, bias_grad)
    call.run("fa_backward", byref(call.params), *map(byref, tensors))
    return _grad_results(frame, *results)


def _backward_operands(frame: Frame, layout: str, dout, q, k, v, out, lse, opts: dict,
                      bias_grad: bool = False):
    """A dense backward's operands (attention_backward's and flashattn.distributed's): its
    _Call, its fa_tensors in fa_backward's order (q, k, v, out, lse, dout, dq, dk, dv), and
    what _grad_results hands back (the gradients, dsinks, dbias)."""
    names = ("dout", "q", "k", "v", "out")
    views = [frame.view(x, n) for x, n in zip((dout, q, k, v, out), names)]
    tg, tq, tk, tv, to = (vw.tensor(layout, n) for vw, n in zip(views, names))
    tl = frame.view(lse, "lse").lse_tensor("lse")
    call = _Call(frame, tq.heads, opts)
    dsinks = call.sink_grad()
    dbias = call.bias_grad(tq.dtype) if bias_grad else None
    grads, tgrads = _grad_outputs(frame, views[1:4], lambda vg, n: vg.tensor(layout, n))
    return call, (tq, tk, tv, to, tl, tg, *tgrads), (grads, dsinks, dbias)


def merge_states(outs: Sequence, lses: Sequence, *, layout: str = "bshd"):
    """Merges partial attention states over disjoint key sets (split-KV, ring attention):
    LSE = ln sum_k exp(LSE_k), O = sum_k exp(LSE_k - LSE) O_k (fa_merge_states). Each out is
    (B, S, H, D) in `layout`, each lse (B, H, S); the empty state (O = 0, LSE = -inf) is
    neutral. Returns (out, lse)."""
    layout = _layout(layout)
    if len(outs) != len(lses) or len(outs) == 0:
        raise N.InvalidArgumentError(f"outs and lses: {len(outs)} and {len(lses)} states; "
                                     "expected the same number, at least one",
                                     N.FA_ERR_INVALID_ARGUMENT)
    frame = Frame(outs[0], "outs[0]")
    if frame.on_gpu:
        raise N.UnsupportedError("merge_states: the states are on a GPU; fa_merge_states runs "
                                 "on the host", N.FA_ERR_UNSUPPORTED)
    n = len(outs)
    vo = [frame.view(x, f"outs[{i}]") for i, x in enumerate(outs)]
    vl = [frame.view(x, f"lses[{i}]") for i, x in enumerate(lses)]
    to = (N.Tensor * n)(*(x.tensor(layout, f"outs[{i}]") for i, x in enumerate(vo)))
    tl = (N.Tensor * n)(*(x.lse_tensor(f"lses[{i}]") for i, x in enumerate(vl)))
    out, vout = frame.empty(vo[0].shape, vo[0].dtype, "out")
    lse, vlse = frame.empty(vl[0].shape, vl[0].dtype, "lse")
    t_out, t_lse = vout.tensor(layout, "out"), vlse.lse_tensor("lse")
    N.check_status(N.lib.fa_merge_states(n, to, tl, byref(t_out), byref(t_lse)), "merge_states")
    return frame.result(out), frame.result(lse)


# ------------------------------------------------------------------ calls of sequences


@_options("score dropout backend isa threads det")
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, return_lse: bool = False, **opts):
    """A variable-length batch (fa_forward_varlen), as FlashAttention's
    flash_attn_varlen_func: q (total_q, Hq, D), k and v (total_k, Hk, D) packed along the
    tokens; cu_seqlens_q and cu_seqlens_k (B + 1 int32 or int64 offsets) say where each
    sequence's rows lie. Each sequence is attended alone (masks aligned within it; it may be
    empty). Returns out (total_q, Hq, Dv), and with return_lse=True lse (Hq, total_q).

    {options}
    """
    frame = Frame(q, "q")
    vq, vk, vv = frame.view(q, "q"), frame.view(k, "k"), frame.view(v, "v")
    tq, tk, tv = _packed(vq, "q"), _packed(vk, "k"), _packed(vv, "v")
    keep_q, iq = _indices(cu_seqlens_q, "cu_seqlens_q")
    keep_k, ik = _indices(cu_seqlens_k, "cu_seqlens_k")
    call = _Call(frame, tq.heads, opts)
    out, vo = frame.empty(tuple(vq.shape[:2]) + (vv.shape[2],), vq.dtype, "out")
    to = _packed(vo, "out")
    lse = tl = None
    if return_lse:
        lse, vl = frame.empty((tq.heads, tq.seqlen), _lse_dtype(vq.dtype), "lse")
        tl = _packed_lse(vl)
    call.run("fa_forward_varlen", byref(call.params), byref(tq), byref(tk), byref(tv),
             byref(iq), byref(ik), byref(to), byref(tl) if tl is not None else None)
    return _forward_results(frame, out, lse)


@_options("score dropout backend isa threads det")
def attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, **opts):
    """Gradients of a variable-length batch (fa_backward_varlen): (dq, dk, dv) packed as q,
    k, v, and with `sinks` also dsinks. lse is the forward's (Hq, total_q).

    {options}
    """
    frame = Frame(q, "q")
    names = ("dout", "q", "k", "v", "out")
    views = [frame.view(x, n) for x, n in zip((dout, q, k, v, out), names)]
    tg, tq, tk, tv, to = (_packed(vw, n) for vw, n in zip(views, names))
    tl = _packed_lse(frame.view(lse, "lse"))
    keep_q, iq = _indices(cu_seqlens_q, "cu_seqlens_q")
    keep_k, ik = _indices(cu_seqlens_k, "cu_seqlens_k")
    call = _Call(frame, tq.heads, opts)
    dsinks = call.sink_grad()
    grads, tgrads = _grad_outputs(frame, views[1:4], _packed)
    call.run("fa_backward_varlen", byref(call.params), byref(tq), byref(tk), byref(tv),
             byref(iq), byref(ik), byref(to), byref(tl), byref(tg), *(byref(t) for t in tgrads))
    return _grad_results(frame, grads, dsinks)


def _pages(block_table, seqused):
    keep_t, table = _indices(block_table, "block_table")
    keep_u, used = _indices(seqused, "seqused_k")
    if keep_t.ndim != 2:
        raise N.InvalidArgumentError(f"block_table: expected (B, max pages), got shape "
                                     f"{keep_t.shape}", N.FA_ERR_SHAPE)
    return (keep_t, keep_u), N.PagedKV(table, keep_t.shape[1], used)


def _kv_layout(kv_layout: str) -> str:
    """FlashInfer's names for a page's layout: NHD (page_size, Hk, D), HND (Hk, page_size, D)."""
    if kv_layout not in ("nhd", "hnd"):
        raise N.InvalidArgumentError(f"kv_layout={kv_layout!r}: expected 'nhd' (pages of "
                                     "(page_size, heads, dim)) or 'hnd' ((heads, page_size, "
                                     "dim))", N.FA_ERR_INVALID_ARGUMENT)
    return "bshd" if kv_layout == "nhd" else "bhsd"


@_options("score backend isa threads")
def attention_paged(q, k_pages, v_pages, block_table, seqused_k, *, layout: str = "bshd",
                    kv_layout: str = "nhd", return_lse: bool = False, **opts):
    """Attention over a paged KV cache (fa_forward_paged), as vLLM, FlashInfer and
    FlashAttention's block_table: k_pages and v_pages are (num_pages, page_size, Hk, D)
    (kv_layout "nhd") or (num_pages, Hk, page_size, D) ("hnd"), any page size >= 1;
    block_table (B, max pages) page ids and seqused_k (B,) the keys each sequence uses; pages
    may be shared. q is (B, Sq, Hq, D) in `layout`: each sequence's last Sq positions
    (bottom-right) for decode (Sq = 1) or a chunk of prefill. Returns out like q, and with
    return_lse=True lse (B, Hq, Sq). Forward only.

    {options}
    """
    layout, kv = _layout(layout), _kv_layout(kv_layout)
    frame = Frame(q, "q")
    vq, vk, vv = frame.view(q, "q"), frame.view(k_pages, "k_pages"), frame.view(v_pages, "v_pages")
    tq, tk, tv = vq.tensor(layout, "q"), vk.tensor(kv, "k_pages"), vv.tensor(kv, "v_pages")
    keep, pages = _pages(block_table, seqused_k)
    call = _Call(frame, tq.heads, opts)
    out, to, lse, tl = _dense_outputs(frame, vq, tq, vv.shape[3], layout, return_lse)
    call.run("fa_forward_paged", byref(call.params), byref(tq), byref(tk), byref(tv),
             byref(pages), byref(to), byref(tl) if tl is not None else None)
    return _forward_results(frame, out, lse)


def _cache(frame, k_cache, v_cache, kv, cache_seqlens, block_table):
    vk, vv = frame.writable(k_cache, "k_cache"), frame.writable(v_cache, "v_cache")
    tk, tv = vk.tensor(kv, "k_cache"), vv.tensor(kv, "v_cache")
    if block_table is None:
        keep, lens = _indices(cache_seqlens, "cache_seqlens")
        return (keep,), tk, tv, byref(lens), None
    keep, pages = _pages(block_table, cache_seqlens)
    return keep, tk, tv, None, byref(pages)


@_options("backend threads")
def append_kv(k_new, v_new, k_cache, v_cache, cache_seqlens, *, block_table=None,
              layout: str = "bshd", kv_layout: str = "nhd", **opts):
    """Writes k_new and v_new (B, S_new, Hk, D) into a cache at each sequence's current
    length cache_seqlens[b] (fa_append_kv): a contiguous cache (B, S_cache, Hk, D) in
    `layout`, or pages (num_pages, page_size, Hk, D) in `kv_layout` with `block_table`. A
    sequence without room is refused with nothing written. cache_seqlens is not changed (add
    S_new yourself).

    {options}
    """
    layout = _layout(layout)
    kv = _kv_layout(kv_layout) if block_table is not None else layout
    frame = Frame(k_cache, "k_cache")
    tkn = frame.view(k_new, "k_new").tensor(layout, "k_new")
    tvn = frame.view(v_new, "v_new").tensor(layout, "v_new")
    keep, tk, tv, lens, pages = _cache(frame, k_cache, v_cache, kv, cache_seqlens, block_table)
    call = _Call(frame, 0, opts)
    call.run("fa_append_kv", byref(tkn), byref(tvn), byref(tk), byref(tv), lens, pages)
    frame.written(k_cache, v_cache)


@_options("score backend isa threads")
def attention_kvcache(q, k_cache, v_cache, *, cache_seqlens, k_new=None, v_new=None,
                      block_table=None, layout: str = "bshd", kv_layout: str = "nhd",
                      return_lse: bool = False, **opts):
    """FlashAttention's flash_attn_with_kvcache (fa_forward_kvcache): appends k_new and v_new
    (if given) to the cache at cache_seqlens, then attends each sequence's Sq query rows to
    its cache_seqlens[b] + S_new keys. The cache is contiguous (B, S_cache, Hk, D) in
    `layout`, or paged with `block_table` (kv_layout as attention_paged's). All or nothing:
    a cache without room is refused with nothing written. Returns out (and lse).

    {options}
    """
    layout = _layout(layout)
    kv = _kv_layout(kv_layout) if block_table is not None else layout
    frame = Frame(q, "q")
    vq = frame.view(q, "q")
    tq = vq.tensor(layout, "q")
    tkn = tvn = None
    if k_new is not None or v_new is not None:
        if k_new is None or v_new is None:
            raise N.InvalidArgumentError("k_new and v_new: give both or neither",
                                         N.FA_ERR_INVALID_ARGUMENT)
        tkn = frame.view(k_new, "k_new").tensor(layout, "k_new")
        tvn = frame.view(v_new, "v_new").tensor(layout, "v_new")
    keep, tk, tv, lens, pages = _cache(frame, k_cache, v_cache, kv, cache_seqlens, block_table)
    call = _Call(frame, tq.heads, opts)
    out, to, lse, tl = _dense_outputs(frame, vq, tq, tv.headdim, layout, return_lse)
    call.run("fa_forward_kvcache", byref(call.params), byref(tq), byref(tk), byref(tv),
             byref(tkn) if tkn is not None else None, byref(tvn) if tvn is not None else None,
             lens, pages, byref(to), byref(tl) if tl is not None else None)
    if tkn is not None:
        frame.written(k_cache, v_cache)
    return _forward_results(frame, out, lse)
