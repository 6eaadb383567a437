"""The entry points' option keywords, from one spec (flashattn._api._OPTIONS): each entry
point still takes every keyword it took when they were written out by hand (names and
defaults, pinned below; an option added since only adds to them), lists each in its
docstring, and refuses others as Python does."""
import inspect
import re

import numpy as np
import pytest

import flashattn as fa
from flashattn import _api

#: Each entry point's positional parameters, and its keyword-only ones with their defaults
#: (sorted by name), as they were before the spec.
API = {
    "attention": ("q k v", """
        alibi_slopes=None, align='bottom-right', attn_mask=None, backend='auto',
        bias_by_slope=False, bias_place='after-scale', block_mask=None, causal=False,
        descale_k=None, descale_q=None, descale_v=None, deterministic=False,
        dropout_p=0.0, isa='auto', layout='bshd', offset=0, out=None, out_dtype=None,
        return_lse=False, scale=None, score_order='softcap-then-alibi', seed=0,
        sink_tokens=0, sinks=None, softcap=None, threads=0, window=None"""),
    "attention_backward": ("dout q k v out lse", """
        alibi_slopes=None, align='bottom-right', attn_mask=None, backend='auto',
        bias_by_slope=False, bias_grad=False, bias_place='after-scale', block_mask=None,
        causal=False, deterministic=False, dropout_p=0.0, isa='auto', layout='bshd',
        offset=0, scale=None, score_order='softcap-then-alibi', seed=0, sink_tokens=0,
        sinks=None, softcap=None, threads=0, window=None"""),
    "attention_varlen": ("q k v cu_seqlens_q cu_seqlens_k", """
        alibi_slopes=None, align='bottom-right', backend='auto', causal=False,
        deterministic=False, dropout_p=0.0, isa='auto', offset=0, return_lse=False,
        scale=None, score_order='softcap-then-alibi', seed=0, sink_tokens=0, sinks=None,
        softcap=None, threads=0, window=None"""),
    "attention_varlen_backward": ("dout q k v out lse cu_seqlens_q cu_seqlens_k", """
        alibi_slopes=None, align='bottom-right', backend='auto', causal=False,
        deterministic=False, dropout_p=0.0, isa='auto', offset=0, scale=None,
        score_order='softcap-then-alibi', seed=0, sink_tokens=0, sinks=None,
        softcap=None, threads=0, window=None"""),
    "attention_paged": ("q k_pages v_pages block_table seqused_k", """
        alibi_slopes=None, align='bottom-right', backend='auto', causal=False,
        isa='auto', kv_layout='nhd', layout='bshd', return_lse=False, scale=None,
        score_order='softcap-then-alibi', sink_tokens=0, sinks=None, softcap=None,
        threads=0, window=None"""),
    "attention_kvcache": ("q k_cache v_cache", """
        alibi_slopes=None, align='bottom-right', backend='auto', block_table=None,
        cache_seqlens, causal=False, isa='auto', k_new=None, kv_layout='nhd',
        layout='bshd', return_lse=False, scale=None, score_order='softcap-then-alibi',
        sink_tokens=0, sinks=None, softcap=None, threads=0, v_new=None, window=None"""),
    "append_kv": ("k_new v_new k_cache v_cache cache_seqlens", """
        backend='auto', block_table=None, kv_layout='nhd', layout='bshd', threads=0"""),
    "check": ("q k v", """
        alibi_slopes=None, align=None, atol=None, attn_mask=None, bias_by_slope=None,
        bias_place=None, block_mask=None, block_table=None, causal=False,
        cu_seqlens_k=None, cu_seqlens_q=None, descale_k=None, descale_q=None,
        descale_v=None, dk=None, dout=None, dq=None, dropout_p=0.0, dtype=None, dv=None,
        kv_layout='nhd', layout='bshd', lse=None, offset=0, out=None,
        profile='flashattn', rtol=None, scale=None, score_order=None, seed=0,
        seqused_k=None, sink_tokens=0, sinks=None, softcap=None, threads=0, window=None"""),
}


@pytest.mark.parametrize("name", sorted(API))
def test_the_keywords_and_defaults_are_the_apis(name):
    sig = inspect.signature(getattr(fa, name))
    pos, kw = API[name]
    assert " ".join(k for k, p in sig.parameters.items() if p.kind is not p.KEYWORD_ONLY) == pos
    now = {f"{k}={p.default!r}" if p.default is not p.empty else k
           for k, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert set(kw.replace(",", " ").split()) <= now


@pytest.mark.parametrize("name", sorted(API))
def test_every_option_is_in_the_docstring(name):
    """Each option keyword an entry point takes starts a paragraph of its docstring (alone
    or with the keywords filled with it: "seed, offset: ...")."""
    f = getattr(fa, name)
    options = {n for o in _api._OPTIONS for n in o.names}
    taken = options & inspect.signature(f).parameters.keys()
    documented = {n for line in re.findall(r"^ {4}(\w[\w, ]*):", f.__doc__, re.M)
                  for n in line.split(", ")}
    assert taken <= documented, taken - documented
    assert "{options}" not in f.__doc__


def test_an_unknown_keyword_is_a_type_error():
    q = np.zeros((1, 2, 1, 4), np.float32)
    with pytest.raises(TypeError, match=r"attention\(\) got an unexpected keyword argument "
                                        r"'causl'"):
        fa.attention(q, q, q, causl=True)
    with pytest.raises(TypeError, match="'isa'"):
        fa.check(q, q, q, out=q, isa="scalar")  # check runs the reference: no ISA


def test_each_option_of_an_entry_point_reaches_the_params():
    """Every option that fills fa_params writes its field when given something other than its
    default (here for attention, which takes them all)."""
    q = np.zeros((1, 4, 2, 8), np.float32)
    given = {"causal": True, "align": "top-left", "window": (3, 1), "softcap": 2.0,
             "alibi_slopes": [0.5, 0.25], "scale": 0.5, "dropout_p": 0.25, "seed": 7,
             "sinks": [1.0, 2.0], "sink_tokens": 2, "score_order": "alibi-then-softcap",
             "attn_mask": np.zeros((4, 4), np.float32), "bias_place": "after-softcap",
             "bias_by_slope": True,
             "block_mask": fa.BlockMask(np.ones((1, 1, 1), np.int32),
                                        np.zeros((1, 1, 1, 1), np.int32)),
             "descale_q": 2.0}
    frame = _api.Frame(q, "q")
    default = _api._Call(frame, 2, {}).params
    for o in _api._OPTIONS:
        if o.fill is None:
            continue
        value = given[o.names[0]]
        p = _api._Call(frame, 2, {o.names[0]: value, **{n: d for n, d in zip(
            o.names[1:], o.defaults[1:])}}, kv_shape=(1, 2)).params
        assert bytes(p) != bytes(default), o.names
