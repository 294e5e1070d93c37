"""FlashL1 (``kernels/l1/``): EcoTransformer L1 attention kernels.

* Numerics: forward and all three gradients against the dense float64 formula of :mod:`kernels.l1.naive` (the
  full ``(B, H, n, n, d)`` difference, masked like :func:`attention.scores.masked_softmax`), with one
  sequence fully real and one padded (or fully padded). They need the kernels to run: on a CUDA GPU,
  or on CPU with ``TRITON_INTERPRET=1`` set before Python starts (Triton picks the interpreter when a
  kernel is defined). Otherwise :func:`test_kernels_under_the_interpreter` reruns this file in a
  subprocess with the variable set, so the default suite always exercises them.
* Launch rule and AOT compilation for sm_80 / sm_90 (no GPU needed; not under the interpreter):
  shared memory within :data:`kernels.common.launch.SHARED_MEMORY_LIMIT`, spills reported (stack bytes).

Shapes are tiny (the interpreter is ~60x slower than torch); wider sweeps are ``slow``.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

from kernels.common.launch import SHARED_MEMORY_LIMIT
from kernels.l1 import launch as flashl1
from kernels.l1.naive import dense_l1
from kernels.l1.ops import flash_l1_attention
from tests.conftest import run_cli
from tests import triton_env
from tests.triton_env import DEVICE, INTERPRETER, KERNELS_RUN

needs_kernels = triton_env.needs_kernels("test_kernels_under_the_interpreter")
needs_compiler = pytest.mark.skipif(INTERPRETER, reason="kernels defined under the interpreter cannot be compiled for a GPU")

pytestmark = pytest.mark.usefixtures("exact_float32_matmuls")  # tests/conftest.py: no TF32, as the tolerances assume


def make_inputs(n, d, lengths, dtype=torch.float32, seed=0, ties=False, strided=False):
    """``q, k, v`` ``(2, 2, n, d)`` (``ties``: multiples of 1/2, so ``q_ic = k_jc`` often; ``strided``: views
    of a ``(B, n, H, d)`` tensor) and the mask with the first ``lengths[b]`` tokens real."""
    generator = torch.Generator().manual_seed(seed)
    shape = (2, n, 2, d) if strided else (2, 2, n, d)
    tensors = [torch.randn(shape, generator=generator) for _ in range(3)]
    if ties:
        tensors = [torch.round(2 * x) / 2 for x in tensors]
    tensors = [x.transpose(1, 2) if strided else x for x in tensors]
    key_mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return [x.to(DEVICE, dtype) for x in tensors], key_mask.to(DEVICE)


def errors(n, d, lengths, lam, dtype=torch.float32, **kwargs):
    """Max |Δ| / max(1, max |reference|) of ``y`` and of the gradients of q, k, v, FlashL1 against
    :func:`dense_l1` (float64 on the same, already rounded, inputs), plus the outputs and gradients themselves."""
    (q, k, v), key_mask = make_inputs(n, d, lengths, dtype, **kwargs)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(9)).to(DEVICE, dtype)
    inputs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = flash_l1_attention(*inputs, key_mask, lam)
    grads = torch.autograd.grad(out, inputs, grad_out)
    ref_inputs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = dense_l1(*ref_inputs, key_mask, lam)
    ref_grads = torch.autograd.grad(ref, ref_inputs, grad_out.double())
    assert out.dtype == dtype and out.shape == q.shape and all(g.dtype == dtype for g in grads)
    error, *grad_errors = [((a.double() - r).abs().max() / r.abs().max().clamp_min(1.0)).item()
                           for a, r in zip((out, *grads), (ref, *ref_grads))]
    print(f"n={n} d={d} lengths={lengths} λ={lam} {dtype}: rel |Δy| {error:.1e}, rel |Δgrad| (q, k, v) "
          f"{', '.join(f'{e:.1e}' for e in grad_errors)}")
    return error, grad_errors, out, grads


CASES = [  # (n, d, lengths, λ)
    (17, 16, [17, 9], 1.0),  # odd n, one tile
    (40, 32, [40, 23], 3.0),
    (70, 16, [70, 41], 1.0),  # two tiles per kernel: online softmax across key tiles
    (33, 24, [33, 30], 2.0),  # head_dim not a power of two
]
SLOW_CASES = [(130, 64, [130, 77], 1.0), (100, 128, [100, 3], 3.0), (257, 32, [257, 200], 1.0), (50, 8, [50, 49], 1.0)]
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1e-2, 2e-2), torch.float16: (2e-3, 3e-3)}  # (y, gradients)


def check(case, dtype=torch.float32, **kwargs):
    error, grad_errors, _, _ = errors(*case, dtype=dtype, **kwargs)
    out_tol, grad_tol = TOLERANCE[dtype]
    assert error <= out_tol
    assert max(grad_errors) <= grad_tol


@needs_kernels
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"n{c[0]}-d{c[1]}")
def test_kernel_matches_dense_float64(case):
    check(case)


@needs_kernels
def test_kernel_bfloat16_inputs():
    check((24, 32, [24, 13], 1.0), torch.bfloat16)


@needs_kernels
def test_kernel_sign_of_zero_and_strided_inputs():
    """Inputs on a grid of 1/2 (many ``q_ic = k_jc``: torch's ``sign(0) = 0``) given as non-contiguous views."""
    check((24, 16, [24, 13], 1.0), ties=True, strided=True)


@needs_kernels
def test_kernel_all_pad_sequence_and_single_token():
    """n = 1, and the second sequence has no real token: its output and all its gradients are exactly 0
    (``masked_softmax``); the first one attends to its only key, so ``y = v``."""
    _, _, out, grads = errors(1, 16, [1, 0], 1.0)
    (_, _, v), _ = make_inputs(1, 16, [1, 0])
    assert torch.equal(out[0], v[0]) and (out[1] == 0).all()
    assert all((g[1] == 0).all() for g in grads)
    check((1, 16, [1, 0], 1.0))


@needs_kernels
def test_kernel_pad_keys_get_exactly_zero_weight():
    """Changing pad tokens' k and v (to huge values) leaves the real rows' output bit-identical and their dk, dv 0."""
    (q, k, v), key_mask = make_inputs(24, 16, [24, 13])
    noise = torch.randn(k.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    junk = torch.where(key_mask[:, None, :, None], 0.0, 1e4 * noise)  # 0 on real tokens
    out = flash_l1_attention(q, k, v, key_mask)
    k2, v2 = (x + junk for x in (k, v))
    inputs = [x.clone().requires_grad_() for x in (q, k2, v2)]
    out2 = flash_l1_attention(*inputs, key_mask)
    assert torch.equal(out, out2)
    _, dk, dv = torch.autograd.grad(out2, inputs, torch.randn_like(out2))
    assert (dk[1, :, 13:] == 0).all() and (dv[1, :, 13:] == 0).all() and dv[1, :, :13].abs().sum() > 0


@needs_kernels
def test_kernel_split_key_gradient_columns(monkeypatch):
    """``_l1_bwd_kv`` with its d columns split over two programs (``BLOCK_DO = BLOCK_D / 2``, the d = 128 rule on sm_80)."""
    rule = flashl1.launch_config

    def split(kernel, *args, **kwargs):
        cfg = rule(kernel, *args, **kwargs)
        if kernel == "_l1_bwd_kv":
            cfg.constexprs["BLOCK_DO"] = cfg.constexprs["BLOCK_D"] // 2
        return cfg

    monkeypatch.setattr(flashl1, "launch_config", split)
    check((24, 32, [24, 13], 3.0))
    check((21, 20, [21, 12], 1.0))  # d = 20: the second half has 4 real columns


@needs_kernels
@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES, ids=lambda c: f"n{c[0]}-d{c[1]}")
def test_kernel_matches_dense_float64_wider(case):
    check(case)


@needs_kernels
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", [(70, 64, [70, 30], 1.0), (45, 128, [45, 45], 3.0)], ids=lambda c: f"n{c[0]}-d{c[1]}")
def test_kernel_half_precision_wider(case, dtype):
    check(case, dtype)


NUMERIC_TESTS = len(CASES) + 5  # the default-suite tests above that run kernels (named test_kernel_*)


@pytest.mark.skipif(KERNELS_RUN, reason="the kernels already run in this process")
def test_kernels_under_the_interpreter():
    """The ``test_kernel_*`` tests in a subprocess with ``TRITON_INTERPRET=1``: all pass, none skipped."""
    proc = run_cli(["-m", "pytest", __file__, "-q", "-s", "-m", "not slow", "-k", "test_kernel_", "-p", "no:cacheprovider"],
                   env={"TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{NUMERIC_TESTS} passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(KERNELS_RUN, reason="the kernels already run in this process")
def test_interpreter_sweep():
    proc = run_cli(["-m", "pytest", __file__, "-q", "-s", "-m", "slow", "-k", "test_kernel_", "-p", "no:cacheprovider"],
                   env={"TRITON_INTERPRET": "1"}, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def test_bad_inputs_raise_clear_errors():
    (q, k, v), key_mask = make_inputs(4, 16, [4, 2])
    with pytest.raises(ValueError, match="head_dim 1..128, got 256"):
        flash_l1_attention(*(torch.zeros(1, 1, 4, 256) for _ in range(3)), key_mask[:1])
    with pytest.raises(ValueError, match="one dtype"):
        flash_l1_attention(q.double(), k.double(), v.double(), key_mask)
    with pytest.raises(ValueError, match="key_mask bool"):
        flash_l1_attention(q, k, v, key_mask.float())
    with pytest.raises(ValueError, match="lam"):
        flash_l1_attention(q, k, v, key_mask, lam=0.0)


# ---- launch parameters and AOT compilation for sm_80 / sm_90 ------------------------------------------

DTYPES = {"fp32": (torch.float32, False), "fp32-tf32": (torch.float32, True), "bf16": (torch.bfloat16, False),
          "fp16": (torch.float16, False)}  # name -> (dtype, TF32 dots)
HEAD_DIMS = (16, 32, 64, 128)  # BLOCK_D = max(16, next_pow2(d)): these stand for every d in 1..128


@pytest.mark.parametrize("capability", sorted(SHARED_MEMORY_LIMIT))
def test_rule_keeps_the_estimate_under_the_limit(capability):
    """Cheap (no compile): every kernel, dtype, head_dim and n gets power-of-two tiles ≥ 16 whose estimate fits."""
    limit = SHARED_MEMORY_LIMIT[capability] - flashl1.MARGIN
    for kernel, (dtype, tf32), d, n in itertools.product(flashl1.KERNELS, DTYPES.values(), range(1, 129), (1, 17, 100, 4096)):
        cfg = flashl1.launch_config(kernel, n, d, dtype, capability, tf32)
        sizes = cfg.constexprs
        operand = 4 if sizes["F32_DOT"] else 2
        assert flashl1.shared_memory_estimate(kernel, sizes, cfg.num_stages, operand) <= limit, (kernel, d, n, cfg)
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DO"):
            size = sizes.get(name, 16)
            assert size >= 16 and size & (size - 1) == 0, (kernel, d, n, name, size)
        assert sizes["BLOCK_D"] >= d and sizes.get("BLOCK_DO", 16) <= sizes["BLOCK_D"]
        owned = sizes["BLOCK_N" if kernel == "_l1_bwd_kv" else "BLOCK_M"]
        assert cfg.num_warps * 16 <= owned, (kernel, d, n, cfg)  # the dot layouts put the warps along the owned rows


@functools.lru_cache(maxsize=None)
def compile_case(kernel, capability, dtype_name, d, n=4096):
    from kernels.common import aot

    dtype, tf32 = DTYPES[dtype_name]
    cfg = flashl1.launch_config(kernel, n, d, dtype, capability, tf32)
    return aot.compile_jit(flashl1.kernel_function(kernel), capability, cfg, flashl1.pointer_types(kernel, dtype),
                           flashl1.FLOAT_ARGS, kernel)


def check_fits(kernel, capability, dtype_name, d):
    """Compiles; shared memory within the architecture's limit and not above the rule's estimate + 1 KiB."""
    compiled = compile_case(kernel, capability, dtype_name, d)
    cfg = compiled.config
    where = f"{kernel} sm_{capability} {dtype_name} d={d} {cfg.options}"
    print(f"{where}: shared {compiled.shared:,} B, {compiled.registers} registers, stack {compiled.stack} B")
    assert compiled.shared <= compiled.limit, f"{where}: {compiled.shared:,} B shared > limit {compiled.limit:,}"
    estimate = flashl1.shared_memory_estimate(kernel, cfg.constexprs, cfg.num_stages, 4 if cfg.constexprs["F32_DOT"] else 2)
    assert compiled.shared <= estimate + 1024, f"{where}: estimate {estimate:,} B under-counts {compiled.shared:,} B"


def check_no_spills(kernel, capability, dtype_name, d):
    compiled = compile_case(kernel, capability, dtype_name, d)
    assert compiled.stack == 0, (f"{kernel} sm_{capability} {dtype_name} d={d} {compiled.config.options}: registers spill "
                                 f"({compiled.stack} B stack frame, {compiled.registers} registers)")


CASE = "kernel, capability, dtype_name, d"
AOT_FAST = [("_l1_bwd_kv", 80, "bf16", 128)]  # the register-heaviest: its dK, dV columns split over programs
AOT_SLOW = [case for case in itertools.product(flashl1.KERNELS, (80, 90), DTYPES, HEAD_DIMS) if case not in AOT_FAST]
# Every kernel, sm_80 / sm_90, fp32 / TF32 / bf16 / fp16 and d = 16..128 compiles without spills (float32 ieee
# dots at d = 128 on sm_90 only with the backward's (16, 16) one-warp tiles of flashl1.tiles).


@needs_compiler
@pytest.mark.parametrize(CASE, AOT_FAST)
def test_aot_compiles_within_limits_without_spills(kernel, capability, dtype_name, d):
    check_fits(kernel, capability, dtype_name, d)
    check_no_spills(kernel, capability, dtype_name, d)


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize(CASE, AOT_SLOW)
def test_aot_every_kernel_arch_dtype_and_head_dim_fits(kernel, capability, dtype_name, d):
    check_fits(kernel, capability, dtype_name, d)


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize(CASE, AOT_SLOW)
def test_aot_every_kernel_arch_dtype_and_head_dim_has_no_spills(kernel, capability, dtype_name, d):
    check_no_spills(kernel, capability, dtype_name, d)
