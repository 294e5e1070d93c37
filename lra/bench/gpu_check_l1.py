"""FlashL1 half of ``python -m lra.bench.gpu_check``'s ``kernels`` step (CUDA only).

FlashL1 (:func:`kernels.l1.ops.flash_l1_attention`, what :class:`attention.l1.L1Attention` runs on CUDA
without attention dropout) against the PyTorch path of the same attention that CUDA takes with dropout
on (:func:`reference_l1`: :meth:`attention.l1.L1Attention.materialised`, the :class:`attention.scores.L1Score`
weights, ``cdist`` forward and query-chunked backward, then ``weights @ V``), forward and backward (``q, k, v`` gradients of ``Σ y²``) in fp32 and
bf16 for the shapes of :data:`L1_SHAPES` (n odd and even, one and several tiles, padded keys and an
all-pad sequence). One markdown row per dtype and shape with both relative errors (Frobenius) and the
launch tiles of the three kernels on this GPU; raises at the end when any row is off.
"""

from __future__ import annotations

L1_SHAPES = [  # (n, d, real tokens of the two sequences, λ)
    (1, 16, (1, 0), 1.0),  # one token; the second sequence all pad (output and gradients 0)
    (17, 16, (17, 9), 1.0),  # odd n, one tile
    (64, 32, (64, 40), 3.0),  # even n
    (129, 64, (129, 100), 1.0),  # odd n, several tiles
    (96, 24, (96, 0), 1.0),  # head_dim not a power of two, all-pad sequence
    (257, 128, (257, 131), 3.0),  # d = 128 (sm_90 float32: the one-warp backward tiles)
]
TOLERANCE = {"fp32": (1e-3, 1e-2), "bf16": (5e-2, 5e-2)}  # relative (output, gradients), as FlashCUR's


def reference_l1(q, k, v, key_mask, lam: float):
    """``softmax(−λ‖q_i − k_j‖₁/√d + pad mask) V`` through PyTorch ops only (no Triton), in float32, cast back:
    :meth:`attention.l1.L1Attention.materialised`, without dropout."""
    from attention.l1 import L1Attention

    return L1Attention(q.shape[1], q.shape[-1], lam).materialised(q, k, v, key_mask)


def launch_summary(n: int, d: int, like) -> str:
    """``kernel rows×rows/warps`` of each FlashL1 kernel as :func:`kernels.l1.launch.config` launches it."""
    from kernels.l1 import launch

    parts = []
    for kernel in launch.KERNELS:
        cfg = launch.config(kernel, n, d, like)
        c = cfg.constexprs
        split = f" do{c['BLOCK_DO']}" if c.get("BLOCK_DO", c["BLOCK_D"]) != c["BLOCK_D"] else ""
        parts.append(f"{kernel[1:]} {c['BLOCK_M']}×{c['BLOCK_N']}×{c['BLOCK_D']}{split}/{cfg.num_warps}w/{cfg.num_stages}s")
    return ", ".join(parts)


def flashl1_checks() -> list[str]:
    """FlashL1 vs :func:`reference_l1` on CUDA per dtype and shape: one markdown table row each; raises if any is off."""
    import torch

    from kernels.l1.ops import flash_l1_attention

    if not torch.cuda.is_available():
        raise RuntimeError("the FlashL1 kernel check needs a CUDA GPU (torch.cuda.is_available() is False)")
    rows = ["| dtype | n | d | real tokens | λ | out rel. err | grad rel. err | launch (M×N×D/warps/stages) |",
            "|---|---|---|---|---|---|---|---|"]
    failed = []
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for n, d, lengths, lam in L1_SHAPES:
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(2, 2, n, d, device="cuda", generator=gen).to(dtype).requires_grad_() for _ in range(3))
            mask = torch.arange(n, device="cuda")[None, :] < torch.tensor(lengths, device="cuda")[:, None]
            results = []
            for attend in (flash_l1_attention, reference_l1):
                out = attend(q, k, v, mask, lam)
                grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
                results.append((out.float(), torch.cat([g.float().flatten() for g in grads])))
            (out, grad), (ref, ref_grad) = results
            err = ((out - ref).norm() / ref.norm().clamp_min(1e-12)).item()
            grad_err = ((grad - ref_grad).norm() / ref_grad.norm().clamp_min(1e-12)).item()
            rows.append(f"| {dtype_name} | {n} | {d} | {lengths} | {lam} | {err:.2e} | {grad_err:.2e} | "
                        f"{launch_summary(n, d, q)} |")
            if not (err <= TOLERANCE[dtype_name][0] and grad_err <= TOLERANCE[dtype_name][1]):
                failed.append(f"{dtype_name} n={n} d={d}")
    if failed:
        raise AssertionError(f"FlashL1 differs from the PyTorch L1 path beyond {TOLERANCE} for: {', '.join(failed)}\n"
                             + "\n".join(rows))
    return rows
