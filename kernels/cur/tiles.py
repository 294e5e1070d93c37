"""The measured tile tables of the FlashCUR launches: which tiles each kernel stages through shared memory
(:data:`TILES`, for :func:`kernels.cur.launch.shared_memory_estimate`) and the register rule (:data:`REGISTER_TILES`,
:data:`REGISTER_EXCEPTIONS`, :data:`TILE_WARPS`, :func:`register_launch`) under which no launch spills on sm_80 or
sm_90. :mod:`kernels.cur.launch` chooses each launch from them; ``tests/kernels/test_aot_compile.py`` compiles
every launch for both architectures and checks these tables against ptxas (re-run its ``-m slow`` half after
changing a kernel or a table).
"""

from __future__ import annotations

import torch

from kernels.common.launch import MIN_DOT

# How each kernel walks its work. "rows": a program owns BLOCK_M of the m selected rows/keys and loops
# over the n tokens in BLOCK_N tiles. "tokens": a program owns BLOCK_N tokens and loops over the m
# slots in BLOCK_M chunks (one chunk when BLOCK_M = M). "u": BLOCK_M rows of U against all m keys.
KIND = {"_rv_fwd": "rows", "_rv_bwd_q": "rows", "_out_bwd_kw": "rows", "_u_fwd": "u",
        "_out_fwd": "tokens", "_rv_bwd_kv": "tokens", "_out_bwd_q": "tokens"}

# Per kernel: which tiles are dot operands (staged through shared memory), as (rows, cols, float32?,
# twice under TF32?). float32: the tensor is float32 (W, RV, their gradients, probabilities) or is cast
# to float32 for an IEEE dot with one (:func:`kernels.cur.forward.mm32`), whatever the input dtype.
# Twice: used both as a dot's B and as its Bᵀ; with TF32 (32-bit tensor-core operands, which cannot
# be transposed on load) Triton stages a second, transposed copy. "fixed" tiles are loaded once per
# program; "loop" tiles once per iteration of the kernel's loop (pipelined: num_stages - 1 copies in
# flight); "scratch" are tiles computed in registers and fed to a dot (probabilities, dS), and
# _u_fwd's softmax tile, which Triton stages through shared memory to store. Measured
# (tests/kernels/test_aot_compile.py): the estimate is within 1 KiB of, or above, Triton 3.9's allocation for
# every kernel, dtype and shape on sm_80 and sm_90. Since bf16 / fp16 launches cast W, RV, dRV and the
# probability tiles to the input dtype for their tensor-core dots (forward.mm_in), the float32 flag
# over-counts those tiles there (2 bytes, not 4); kept, as the safe side (the measured allocations against the
# estimate: docs/flashcur.md, "Shared memory of the bf16 launches").
_ND, _MD = ("BLOCK_N", "BLOCK_D"), ("BLOCK_M", "BLOCK_D")
TILES = {
    "_rv_fwd": {"fixed": [(*_MD, False, False)], "loop": [(*_ND, False, False)] * 2, "scratch": [("BLOCK_M", "BLOCK_N", False, False)]},
    "_u_fwd": {"fixed": [(*_MD, False, False), ("M", "BLOCK_D", False, False)], "scratch": [("BLOCK_M", "M", True, False)]},
    "_out_fwd": {"fixed": [(*_ND, False, False)], "loop": [(*_MD, False, False), (*_MD, True, False)],
                 "scratch": [("BLOCK_N", "BLOCK_M", True, False)]},
    "_rv_bwd_kv": {"fixed": [(*_ND, False, False), (*_ND, True, False)], "loop": [(*_MD, False, True), (*_MD, True, True)],
                   # P, dP, dS in float32 (layout conversions between tensor-core and FMA results), dS as an operand
                   "scratch": [("BLOCK_N", "BLOCK_M", True, False)] * 3 + [("BLOCK_N", "BLOCK_M", False, False)]},
    "_rv_bwd_q": {"fixed": [(*_MD, False, False), (*_MD, True, False)], "loop": [(*_ND, False, True), (*_ND, True, False)],
                  "scratch": [("BLOCK_M", "BLOCK_N", False, False)]},
    "_out_bwd_q": {"fixed": [(*_ND, False, False), (*_ND, True, False)], "loop": [(*_MD, False, True), (*_MD, True, False)],
                   "scratch": [("BLOCK_N", "BLOCK_M", False, False)]},
    "_out_bwd_kw": {"fixed": [(*_MD, False, False), (*_MD, True, False)], "loop": [(*_ND, False, True), (*_ND, True, True)],
                    "scratch": [("BLOCK_M", "BLOCK_N", True, False), ("BLOCK_M", "BLOCK_N", False, False)]},
}

# Registers. Every kernel but _rv_fwd and _u_fwd multiplies by a float32 tensor (W, RV, their
# gradients), and with float32 inputs every dot is float32: those dots run in IEEE precision on the
# FMA units (TF32 only when asked), where Triton keeps both operands in registers for the whole K
# dimension, so the register need grows with the tiles and head_dim. With bf16 / fp16 inputs ("half") every
# dot runs on tensor cores, and the tiles are sized for them: 64 tokens × 64 rows (as many as m allows), 8 warps,
# 2 stages, chosen from an AOT sweep of 64- and 32-token tiles × 4 / 8 warps × 2 / 3 stages at every m and head
# dim on sm_80 and sm_90 (2026-11-29, Triton 3.9.0; docs/flashcur.md): that launch spills in none of
# _rv_bwd_q's cells and in 1–5 of each other kernel's 16, fixed by REGISTER_EXCEPTIONS. Which tiles run fastest
# is a GPU measurement still to make (the float32-era 16 × 16 and 32 × 32 tiles compiled too). Tiles sized for shared memory
# alone spill (m = d = 128 on sm_80: fp32 _rv_fwd 7,536 B of stack per thread, bf16 _rv_bwd_kv
# 47,248 B). These launches follow a register rule (:func:`register_launch`): REGISTER_TILES per
# kernel and operand class (:func:`operands`), a few general limits, and REGISTER_EXCEPTIONS, all
# measured so that no launch spills on sm_80 or sm_90 (tests/kernels/test_aot_compile.py compiles every
# one; figures in docs/flashcur.md). ptxas' register allocation is not monotone in the tile sizes
# (a smaller tile can spill where a larger one does not), hence a measured table and not a formula:
# re-run ``pytest -m slow tests/kernels/test_aot_compile.py`` after changing a kernel.
SHARED_RULE = None  # only tensor-core dots (bf16 / fp16 / TF32 _rv_fwd, _u_fwd): shared memory decides
SHARED_RULE_WARPS = 4
# ... but a split _rv_fwd (kernels.cur.forward: the per-split partial store) whose BLOCK_M × BLOCK_D float32
# accumulator reaches 64 × 128 spills 24 B (sm_80) / 96 B (sm_90) with 4 warps in bf16; 8 warps spill nothing.
SHARED_RULE_WIDE, SHARED_RULE_WIDE_WARPS = 64 * 128, 8
REGISTER_TILES = {  # kernel: {operands: (largest BLOCK_N, largest BLOCK_M, num_warps, num_stages)}
    "_rv_fwd": {"fp32": (32, 32, 8, 2), "tf32": (32, 32, 8, 2), "half": SHARED_RULE},
    "_u_fwd": {"fp32": (MIN_DOT, 32, 8, 1), "tf32": SHARED_RULE, "half": SHARED_RULE},
    "_out_fwd": {"fp32": (32, 32, 8, 2), "tf32": (32, 32, 8, 2), "half": (64, 64, 8, 2)},
    "_rv_bwd_kv": {"fp32": (32, 32, 8, 2), "tf32": (32, 32, 8, 2), "half": (64, 64, 8, 2)},
    "_rv_bwd_q": {"fp32": (32, 32, 8, 2), "tf32": (32, 32, 8, 2), "half": (64, 64, 8, 2)},
    "_out_bwd_q": {"fp32": (32, 32, 8, 2), "tf32": (32, 32, 8, 2), "half": (64, 64, 8, 2)},
    "_out_bwd_kw": {"fp32": (32, 32, 8, 2), "tf32": (32, 32, 8, 2), "half": (64, 64, 8, 2)},
}
# Cells where the general rule spills (8–192 B) and this launch does not, on both architectures:
# (kernel, operands, BLOCK_D, m, BLOCK_N) -> (BLOCK_M, num_warps, num_stages).
REGISTER_EXCEPTIONS = {
    ("_out_fwd", "tf32", 128, 32, 32): (16, 4, 2),
    ("_out_fwd", "half", 128, 32, 32): (16, 4, 2),
    ("_out_fwd", "half", 16, 32, 16): (16, 4, 2),
    ("_rv_bwd_kv", "tf32", 32, 32, 32): (16, 4, 2),
    ("_out_bwd_q", "half", 128, 32, 16): (16, 8, 3),
    ("_out_bwd_q", "half", 64, 128, 32): (16, 8, 2),  # since Δ_C comes from the output (ptxas holds 128 and spills 8 B)
    # the 64-token half tiles (spills of the rule's launch on sm_80 / sm_90 in the comment)
    ("_rv_bwd_kv", "half", 16, 128, 64): (64, 8, 3),     # 16 / 0 B
    ("_rv_bwd_kv", "half", 128, 128, 64): (16, 8, 2),    # 0 / 168 B; 32 rows spill at 4 and 8 warps
    ("_rv_bwd_kv", "half", 32, 128, 32): (32, 8, 3),     # 8 / 0 B (n = 32)
    ("_out_fwd", "half", 32, 128, 64): (64, 4, 2),       # 32 / 0 B
    ("_out_bwd_q", "half", 32, 128, 64): (64, 8, 3),     # 16 / 0 B
    ("_out_bwd_q", "half", 128, 128, 64): (32, 4, 2),    # 0 / 192 B
    ("_out_bwd_kw", "half", 64, 32, 64): (32, 8, 3),     # 0 / 32 B
    ("_out_bwd_kw", "half", 64, 64, 64): (32, 8, 3),     # 24 / 0 B
    ("_out_bwd_kw", "half", 64, 128, 64): (32, 8, 3),    # 24 / 0 B
    ("_out_bwd_kw", "half", 128, 64, 64): (32, 8, 2),    # 0 / 24 B
    ("_out_bwd_kw", "half", 128, 128, 64): (32, 8, 2),   # 0 / 24 B
}
# Tiles of the split kernels that spill 8–24 B with the rule's 8 warps on sm_90 (since the split of n) and
# nothing with 4 on either architecture, whatever m: (kernel, operands, BLOCK_D, BLOCK_N, BLOCK_M) -> num_warps.
TILE_WARPS = {
    ("_rv_fwd", "fp32", 16, 32, 16): 4,
    ("_rv_fwd", "tf32", 64, 32, 32): 4,
    ("_out_bwd_kw", "fp32", 64, 16, 16): 4,
    ("_out_bwd_kw", "tf32", 64, 16, 16): 4,
}


def operands(dtype: torch.dtype, tf32: bool) -> str:
    """Operand class of a launch: "fp32" (float32 inputs, IEEE dots on FMA units), "tf32" (float32
    inputs, tensor-core TF32 dots), "half" (bf16 / fp16 inputs: every dot on tensor cores, W and RV cast)."""
    if dtype != torch.float32:
        return "half"
    return "tf32" if tf32 else "fp32"


def register_launch(kernel: str, operand_class: str, m: int, block_d: int, block_n: int) -> tuple[int, int, int] | None:
    """``(largest BLOCK_M, num_warps, num_stages)`` of the register rule for a program of ``block_n``
    tokens, or None under :data:`SHARED_RULE`.

    :data:`REGISTER_TILES`, then: BLOCK_M ≤ m and BLOCK_M ≤ BLOCK_N; a "tokens" kernel in float32 takes its m
    slots in at least two chunks from m = 32 (one loop trip over 32 slots spills up to 288 B at
    head_dim 128; half tiles take up to 64 slots a trip); _rv_bwd_q keeps 8 warps only for 32 × 32 float32 tiles at
    head_dim ≥ 64 and 64-token half tiles (smaller programs spill 8–24 B with 8 warps: ptxas trades registers for
    occupancy); _u_fwd cannot chunk its m keys
    (its softmax spans them all), so in fp32 it takes 16-row tiles from m · BLOCK_D = 64 · 128 (32
    rows spill 176 B) and 16 warps at 128 · 128 (8 warps spill 176 B); last
    :data:`REGISTER_EXCEPTIONS`, then :data:`TILE_WARPS`.
    """
    tiles = REGISTER_TILES[kernel][operand_class]
    if tiles is SHARED_RULE:
        return None
    _, block_m, warps, stages = tiles
    kind = KIND[kernel]
    block_m = min(block_m, m)
    if kind != "u":
        block_m = min(block_m, block_n)
    half = operand_class == "half"
    if kind == "tokens" and not half:
        block_m = min(block_m, max(MIN_DOT, m // 2))
    if kernel == "_rv_bwd_q" and not (block_n >= 64 if half else block_n >= 32 and block_m >= 32 and block_d >= 64):
        warps = 4
    if kernel == "_u_fwd" and m * block_d >= 64 * 128:
        block_m, warps = MIN_DOT, 16 if m * block_d >= 128 * 128 else warps
    block_m, warps, stages = REGISTER_EXCEPTIONS.get((kernel, operand_class, block_d, m, block_n), (block_m, warps, stages))
    return block_m, TILE_WARPS.get((kernel, operand_class, block_d, block_n, block_m), warps), stages
