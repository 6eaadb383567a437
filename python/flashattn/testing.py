"""Helpers for a kernel's pytest suite: ``assert_attention_close`` adopts the oracle in one
line, as ``torch.testing.assert_close`` and ``numpy.testing`` do for plain tensors."""
from __future__ import annotations

from ._check import CheckReport, check


def assert_attention_close(q, k, v, *, msg: str | None = None, **kwargs) -> CheckReport:
    """Raises AssertionError carrying the report unless the candidate's results (out=, lse=,
    dq=, dk=, dv=: any of them) pass flashattn.check for the inputs q, k, v (dout= for
    gradients) and the same options (attn_mask= among them); returns the report when they do.

        from flashattn.testing import assert_attention_close
        assert_attention_close(q, k, v, out=my_kernel(q, k, v, causal=True), causal=True)
    """
    report = check(q, k, v, **kwargs)
    if not report:
        raise AssertionError(f"{msg}\n{report}" if msg else str(report))
    return report
