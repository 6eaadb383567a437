"""flashattn: exact attention built the FlashAttention way, and the float64 oracle that
attention kernels are checked against.

    import flashattn
    out = flashattn.attention(q, k, v, causal=True)          # numpy, torch, JAX, CuPy arrays
    report = flashattn.check(q, k, v, out=my_out, causal=True)  # against the float64 reference
    print(report)                                             # the verdict per tensor

The functions mirror the C library's (include/flashattn.h; docs/DESIGN.md is the contract):
attention, attention_backward, merge_states, the calls of sequences (attention_varlen and
its backward, attention_paged, attention_kvcache, append_kv), block-sparse masks (BlockMask,
or FlexAttention's), and the oracle (check, testing.assert_attention_close). Errors are
raised as InvalidArgumentError (a ValueError naming the argument), UnsupportedError,
OutOfMemoryError, BackendUnavailableError, DeviceError and CommunicationError, all
FlashAttnError, and TypeError for what is not an array of a stored dtype or mixes frameworks;
nothing is written when one is raised. The functions run eagerly on concrete arrays (not inside jax.jit or torch.compile
traces). flashattn.distributed (import it) runs one sequence sharded over MPI ranks (mpi4py).
"""
from . import testing
from ._api import (BlockMask, append_kv, attention, attention_backward, attention_kvcache,
                   attention_paged, attention_varlen, attention_varlen_backward, merge_states)
from ._check import CheckReport, TensorReport, check, profile_names
from ._native import (BackendUnavailableError, CommunicationError, DeviceError, FlashAttnError,
                      InvalidArgumentError, OutOfMemoryError, UnsupportedError, describe,
                      version)

__version__ = version()

__all__ = [
    "attention", "attention_backward", "merge_states", "attention_varlen",
    "attention_varlen_backward", "attention_paged", "attention_kvcache", "append_kv", "check",
    "CheckReport", "TensorReport", "profile_names", "testing", "describe", "version",
    "BlockMask", "FlashAttnError", "InvalidArgumentError", "UnsupportedError",
    "OutOfMemoryError", "BackendUnavailableError", "DeviceError", "CommunicationError",
]
