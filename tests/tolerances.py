"""Tolerances for a floating-point result against a float64 reference, from its dtype and reduction length.

Why not a fixed ``atol=1e-6``: ATen's CPU kernels sum in SIMD lanes whose width depends on the instruction
set they were dispatched to (``ATEN_CPU_CAPABILITY`` = default, avx2, avx512), so the order of the additions,
hence the rounding, differs from machine to machine (fp32 softmax over 4,097 keys: 0.89e-6 off on AVX-512,
1.43e-6 on AVX2). A test must hold for every order. Summing n terms with unit roundoff u (half the dtype's
eps) errs by at most γ_n = n·u/(1 − n·u) relative to Σ|terms| in any order (Higham, *Accuracy and Stability
of Numerical Algorithms*, 2002, §4.2); rounding errors in practice behave as independent and mean zero, so
the error grows as λ·√n·u (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019). We take λ = 2: fp32 softmax
over 4,097 keys errs by at most 2.7e-6 on default, AVX2 and AVX-512 kernels, a quarter of its bound 1.0e-5.

On top of the sums: every elementwise operation (and the rounding of the result) adds up to one u each
(``ELEMENTWISE_ULPS`` of them), and a function that amplifies its input's rounding adds its condition
number times u (``conditioning``; e.g. ``exp(x − max)`` turns the rounding of ``x − max`` into a relative
error ``|x − max|·u``, so a softmax passes the spread of its logits).

The result is an ``rtol``; values that cancel (outputs ``Σ w·v`` of mixed sign) are bounded relative to the
size of the terms instead: ``atol = rtol · scale``. float64 stays tight: u = 1.1e-16, so the same formula
gives ~1e-14.
"""

from __future__ import annotations

import math

import torch

LAMBDA = 2.0  # error of a sum of n terms: λ·√n·u (Higham & Mary 2019)
ELEMENTWISE_ULPS = 8  # exp, division, scaling, the roundings of the inputs and of the result


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2: the largest relative error of one rounding (fp32 6.0e-8, bf16 3.9e-3, fp64 1.1e-16)."""
    return torch.finfo(dtype).eps / 2


def rtol_for(dtype: torch.dtype, n: int, *, reductions: int = 1, accumulate: torch.dtype | None = None,
             conditioning: float = 0.0) -> float:
    """Relative error bound of a result in ``dtype`` made of ``reductions`` chained sums of ``n`` terms,
    accumulated in ``accumulate`` (default ``dtype``; ATen sums bf16 in fp32), whose inputs are amplified by
    ``conditioning``."""
    u_sum = unit_roundoff(accumulate or dtype)
    return reductions * LAMBDA * math.sqrt(n) * u_sum + (ELEMENTWISE_ULPS + conditioning) * unit_roundoff(dtype)


def tolerance(dtype: torch.dtype, n: int, *, scale: float = 0.0, **options) -> dict[str, float]:
    """``rtol``/``atol`` for ``torch.testing.assert_close`` (see :func:`rtol_for` for ``options``);
    ``atol = rtol · scale``, ``scale`` the size of the summed terms where results can cancel to ~0."""
    rtol = rtol_for(dtype, n, **options)
    return {"rtol": rtol, "atol": rtol * float(scale)}
