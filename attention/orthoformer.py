"""Orthoformer attention (Patrick et al. 2021, "Keeping Your Eye on the Ball: Trajectory Attention in Video
Transformers", §3.2 and Algorithm 1; the authors' code: facebookresearch/Motionformer ``orthoformer_helper.py``).

Attention through m landmarks chosen among the queries, greedily most orthogonal to each other:

* selection (Algorithm 1): q̂ = q / ‖q‖; start from a random token; then, m − 1 times, add the unselected token
  whose largest |cosine| with the selected ones is smallest. Done without gradient (the authors' ``no_grad``);
  the landmarks are the selected queries ``L`` (scaled as below).
* attention: with ``Q, K`` each scaled by ``d^{-1/4}``, ``Y = softmax(Q Lᵀ) (softmax(L Kᵀ) V)``: cost O(n m d)
  time (the selection too: m steps of O(n d)), O(n m) memory.

Shapes: ``q, k, v`` ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)`` -> ``(B, H, n, d)``; one landmark set per
sequence and head (the authors fold heads into the batch).

Decisions and what the authors' code does not cover:
* Pads are never landmarks, and pad keys are masked in ``softmax(L Kᵀ)``. A sequence with fewer real tokens than m
  uses all of them: the greedy steps past that point find no candidate, and those landmark slots are masked
  out of ``softmax(Q Lᵀ)`` (the authors' code has no mask and would pick pads).
* The first landmark is drawn from the default generator of the inputs' device (``torch.rand``, as the authors'
  ``torch.randint``), in training and evaluation alike; a test seeds it. So the output depends on that draw, and
  on the padded length (the draw's shape) when m < the real length: appending pads leaves real outputs unchanged
  only when m ≥ the number of real tokens (then every real token is a landmark whatever the draw).
* The m-step greedy loop is a Python loop over landmarks (sequential by construction), each step vectorised over
  batch, heads and tokens; no host sync (argmin and gathers stay on the device).
* There is no softmax limit: with m = n, ``L = Q`` and ``Y = softmax(QQᵀ) softmax(QKᵀ) V``, not ``softmax(QKᵀ) V``.

Defaults: m = 128 (Proxyformer Table 1's "Orthoformer-128").
"""

from __future__ import annotations

import torch
from torch import nn

from attention.config_checks import check_positive_int


def orthogonal_landmarks(q: torch.Tensor, real: torch.Tensor, num_landmarks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1 over ``q`` ``(B, H, n, d)`` with ``real`` bool ``(B, 1, n)``: indices ``(B, H, m)`` and a bool
    ``(B, H, m)`` that is False for slots with no candidate left (all real tokens already taken)."""
    unit = torch.nn.functional.normalize(q, dim=-1)
    candidates = real.expand(q.shape[:-1])  # (B, H, n): real and not yet selected
    draw = torch.rand(q.shape[:-1], device=q.device).masked_fill(~candidates, -1.0)
    index = draw.argmax(-1)  # the random first landmark: any real token
    worst = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)  # max |cos| with the selected landmarks
    indices, valid = [], []
    for _ in range(num_landmarks):
        ok = candidates.gather(-1, index[..., None])[..., 0]
        indices.append(index)
        valid.append(ok)
        candidates = candidates & (torch.arange(q.shape[-2], device=q.device) != index[..., None])
        chosen = unit.gather(-2, index[..., None, None].expand(*index.shape, 1, q.shape[-1]))  # (B, H, 1, d)
        worst = torch.maximum(worst, (unit @ chosen.transpose(-1, -2))[..., 0].abs())
        index = worst.masked_fill(~candidates, torch.inf).argmin(-1)
    return torch.stack(indices, -1), torch.stack(valid, -1)


class OrthoformerAttention(nn.Module):
    """Softmax attention through greedily most-orthogonal query landmarks (see the module docstring)."""

    def __init__(self, num_heads: int, head_dim: int, num_landmarks: int = 128):
        super().__init__()
        self.head_dim = head_dim
        self.num_landmarks = check_positive_int(num_landmarks, "num_landmarks")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        scale = self.head_dim**-0.25
        q, k = q * scale, k * scale
        with torch.no_grad():
            indices, valid = orthogonal_landmarks(q, key_mask[:, None, :], self.num_landmarks)
        landmarks = q.detach().gather(-2, indices[..., None].expand(*indices.shape, q.shape[-1]))  # (B, H, m, d)
        floor = torch.finfo(q.dtype).min
        kernel_1 = (q @ landmarks.transpose(-1, -2)).masked_fill(~valid[..., None, :], floor).softmax(-1)  # (B, H, n, m)
        kernel_2 = (landmarks @ k.transpose(-1, -2)).masked_fill(~key_mask[:, None, None, :], floor).softmax(-1)
        return kernel_1 @ (kernel_2 @ v)
