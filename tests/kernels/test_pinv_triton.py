"""The fused pseudo-inverse (:mod:`kernels.pinv`): where :func:`attention.pinv.iterative_pinv` runs it, the kernels it
launches (counted on ``meta``), ``torch.compile(fullgraph=True)``, ahead-of-time compilation for sm_80 / sm_90 and,
through a subprocess with ``TRITON_INTERPRET=1``, the kernels' numbers (``tests/kernels/test_pinv_triton_kernels.py``).

Why a subprocess: Triton picks the interpreter when a kernel is *defined*, from the environment at that moment,
so it cannot be switched on for one test inside a pytest process other tests share.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attention.pinv import iterative_pinv
from kernels.common.launch import SHARED_MEMORY_LIMIT
from kernels.pinv import launch
from kernels.pinv.ops import start_norm
from tests.conftest import run_cli

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def interpreted_kernel_tests(marks: str):
    proc = run_cli(["-m", "pytest", "tests/kernels/test_pinv_triton_kernels.py", "-q", "-m", marks,
                    "-p", "no:cacheprovider"], env={"TRITON_INTERPRET": "1"}, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def test_kernels_under_the_interpreter():
    """Forward and ∂A within 4·m·u of the float64 PyTorch form, ties, central differences, compile (tiny shapes)."""
    interpreted_kernel_tests("not slow")


@pytest.mark.slow
def test_kernels_under_the_interpreter_at_every_size():
    """The same at the other sizes (16, 20, 32) and one step."""
    interpreted_kernel_tests("slow")


class Ops(TorchDispatchMode):
    """Records every ATen / custom op that reaches the dispatcher, views and allocations left out."""

    SKIPPED = ("view", "reshape", "_unsafe_view", "expand", "transpose", "t", "empty", "empty_like", "new_empty",
               "detach", "alias", "_to_copy", "lift_fresh")

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in self.SKIPPED:
            self.names.append(f"{func.namespace}.{name}")
        return func(*args, **(kwargs or {}))


def launches(m: int, init: str = "per_head", dtype=torch.float32) -> tuple[list[str], list[str]]:
    """Ops of ``iterative_pinv`` forward and backward on ``meta`` (shapes only: the CUDA path's dispatch)."""
    a = torch.empty(2, 3, m, m, device="meta", dtype=dtype, requires_grad=True)
    with Ops() as forward:
        z = iterative_pinv(a, 6, init)
    grad = torch.empty_like(z)
    with Ops() as backward:
        z.backward(grad)
    return forward.names, backward.names


def test_cuda_path_is_one_launch_forward_and_one_backward():
    """Per-head init (the default): the whole pseudo-inverse is ``lra_pinv.forward`` and ``lra_pinv.backward``
    (the PyTorch form on ``meta``: 24 batched matmuls forward, 48 backward, plus the norms)."""
    assert launches(64) == (["lra_pinv.forward"], ["lra_pinv.backward"])
    assert launches(5)[0] == ["lra_pinv.forward"] and launches(33)[0] == ["lra_pinv.forward"]  # zero-padded tiles


def test_global_init_adds_only_the_shared_norm():
    """``global``: the norm over every matrix is PyTorch reductions (``start_norm``) and their gradient, the rest
    the same two ops, the sum of the per-problem ``∂norm`` and the sum of ``A``'s two gradients."""
    forward, backward = launches(64, "global")
    a = torch.empty(2, 3, 64, 64, device="meta", requires_grad=True)
    with Ops() as norm_forward:
        norm = start_norm(a, "global")
    with Ops() as norm_backward:
        norm.backward(torch.empty_like(norm))
    assert forward == [*norm_forward.names, "lra_pinv.forward"]
    # a's two gradients (through the op and through the norm) are added
    assert backward == ["lra_pinv.backward", "aten.sum", *norm_backward.names, "aten.add"]


@pytest.mark.parametrize("shape, dtype, device", [
    ((4, 65, 65), torch.float32, "meta"),  # m > 64: one problem no longer fits a program's registers
    ((4, 64, 64), torch.float64, "meta"),  # float64 (gradcheck) stays in PyTorch
    ((4, 64, 64), torch.float32, "cpu"),  # CPU: unchanged (C++ kernel or PyTorch)
])
def test_everything_else_runs_the_pytorch_form(shape, dtype, device):
    a = torch.eye(shape[-1], dtype=dtype, device=device).expand(shape).clone()
    with Ops() as ops:
        iterative_pinv(a, 2)
    assert "lra_pinv.forward" not in ops.names and "aten.bmm" in ops.names, ops.names


def test_bf16_input_takes_the_fused_path_in_float32():
    """The iteration always runs in float32; a bf16 matrix (autocast) is cast first, then fused."""
    a = torch.empty(2, 64, 64, device="meta", dtype=torch.bfloat16)
    with Ops() as ops:
        z = iterative_pinv(a, 6)
    assert z.dtype == torch.float32 and ops.names == ["lra_pinv.forward"]


def test_compiles_to_one_graph_on_fake_tensors():
    """``torch.compile(fullgraph=True)`` of the op's forward + backward on ``meta`` (fake tensors throughout): one
    graph, ``lra_pinv.forward`` in its forward and ``lra_pinv.backward`` in its backward. (:func:`iterative_pinv`
    itself cannot be compiled on ``meta``, which has no autocast to turn off; on CUDA it reaches this op, as the
    dispatch tests above show, and ``tests/kernels/test_pinv_triton_kernels.py`` compiles and runs it interpreted.)"""
    from torch._dynamo.backends.common import aot_autograd

    from kernels.pinv.ops import fused_pinv

    graphs: list = []

    def keep(graph, _inputs):
        graphs.append([str(node.target) for node in graph.graph.nodes if node.op == "call_function"])
        return graph.forward

    torch._dynamo.reset()
    compiled = torch.compile(lambda a: fused_pinv(a, 6).sum(), fullgraph=True,
                             backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    a = torch.empty(8, 64, 64, device="meta", requires_grad=True)
    compiled(a).backward()
    assert a.grad.shape == a.shape and len(graphs) == 2
    (forward, backward) = graphs
    assert [t for t in forward if "lra_pinv" in t] == ["lra_pinv.forward.default"], forward
    assert [t for t in backward if "lra_pinv" in t] == ["lra_pinv.backward.default"], backward
    assert not any("bmm" in t for t in forward + backward)


def test_rejects_what_the_kernels_cannot_take():
    from kernels.pinv.ops import fused_pinv

    with pytest.raises(ValueError, match="1 <= m <= 64"):
        fused_pinv(torch.empty(2, 65, 65, device="meta"), 6)
    with pytest.raises(TypeError, match="float32"):
        fused_pinv(torch.empty(2, 16, 16, device="meta", dtype=torch.float64), 6)
    with pytest.raises(ValueError, match="pinv_iters"):
        fused_pinv(torch.empty(2, 16, 16, device="meta"), 0)
    if not INTERPRETED:
        with pytest.raises(RuntimeError, match="CUDA tensors or the Triton interpreter.*iterative_pinv"):
            fused_pinv(torch.eye(16)[None], 6)


# ---- ahead-of-time compilation for sm_80 (A100) and sm_90 (H100), no GPU needed ----------------------------

AOT = pytest.mark.skipif(INTERPRETED, reason="kernels defined under the interpreter cannot be compiled for a GPU")
# (kernel, architecture, m, global norm, steps saved): the per-head training launch, and the global-norm inference
# one (another constexpr combination, so another compile); _pinv_bwd_terms and _pinv_bwd_steps take neither
VARIANTS = ((False, True), (True, False))


def variants(kernel: str):
    return VARIANTS if kernel in ("_pinv_fwd", "_pinv_bwd_grad") else VARIANTS[:1]


FAST_AOT = [(kernel, 80, m, *variant) for kernel in launch.KERNELS for m in (16, 32) for variant in variants(kernel)
            if m == 32 or variant == VARIANTS[0]]
SLOW_AOT = [(kernel, capability, m, *variant) for kernel in launch.KERNELS
            for capability in launch.CHECKED_CAPABILITIES for m in (16, 32, 64) for variant in variants(kernel)
            if (kernel, capability, m, *variant) not in FAST_AOT]


def case_id(case) -> str:
    kernel, capability, m, has_norm, save = case
    unsaved = not save and kernel == "_pinv_fwd"  # (only the forward has that constexpr)
    return f"{kernel}-sm{capability}-m{m}" + ("-global" if has_norm else "") + ("-nosave" if unsaved else "")


@functools.lru_cache(maxsize=None)
def compiled(case):
    kernel, capability, m, has_norm, save = case
    return launch.compile_kernel(kernel, capability, m, has_norm, save)


def check_compiled(case) -> None:
    """Compiles, fits the architecture's shared memory, and spills no registers."""
    result = compiled(case)
    print(f"{case_id(case)} {result.config.options}: shared {result.shared:,} B, "
          f"{result.registers} registers, stack {result.stack} B")
    assert result.shared <= SHARED_MEMORY_LIMIT[case[1]], result
    assert result.stack == 0, f"{case_id(case)}: {result.stack} B of spills; re-measure kernels.pinv.launch.WARPS"


@AOT
@pytest.mark.parametrize("case", FAST_AOT, ids=case_id)
def test_aot_compiles_small_problems_without_spills(case):
    check_compiled(case)


@AOT
@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_AOT, ids=case_id)
def test_aot_compiles_every_size_for_both_architectures(case):
    check_compiled(case)


def test_bench_pinv_on_cpu(tmp_path):
    """``python -m lra.bench pinv``: the PyTorch form timed, the fused rows skipped off CUDA with the reason, and the
    launches of both counted on ``meta`` (1 + 1 fused; 4·n_iter batched matmuls and more for the PyTorch form), the
    errors against float64."""
    import csv

    from lra.bench.__main__ import main

    main(["pinv", "--device", "cpu", "--m", "16", "--problems", "3", "--iters", "2", "--warmup", "0", "--repeats", "1",
          "--threads", "1", "--out", str(tmp_path)])
    with (tmp_path / "pinv.csv").open() as handle:
        rows = {row["form"]: row for row in csv.DictReader(handle)}
    fused, pytorch = rows["fused"], rows["pytorch"]
    assert (fused["status"], fused["reason"]) == ("skipped", "the fused kernels need a CUDA device")
    assert (fused["launches_fwd"], fused["launches_fwdbwd"]) == ("1", "2")
    assert pytorch["status"] == "ok" and float(pytorch["fwd_s"]) > 0 and float(pytorch["fwdbwd_s"]) > 0
    assert int(pytorch["launches_fwd"]) >= 4 * 2 and int(pytorch["launches_fwdbwd"]) >= 12 * 2
    # the float32 PyTorch form against itself in float64: within the kernels' tolerance, and not exactly equal
    assert 0 < float(pytorch["error_fwd"]) <= float(pytorch["bound"]) == 4 * 16 * 2.0**-24
    assert 0 < float(pytorch["error_grad"]) <= float(pytorch["bound"])
    assert fused["error_fwd"] == fused["error_grad"] == ""
