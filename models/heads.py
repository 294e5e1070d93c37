"""Classification heads over pooled encoder features (docs/design.md §3 "The encoder")."""

from __future__ import annotations

import torch
from torch import nn


class MLPHead(nn.Module):
    """``Linear(d_model -> hidden) -> ReLU -> Linear(hidden -> classes)`` over features ``(B, d_model)``."""

    def __init__(self, d_model: int, num_classes: int, hidden_dim: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, num_classes))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)


class PairHead(nn.Module):
    """Two-document head (LRA Retrieval; docs/design.md §3): pooled features ``(B, 2, d_model)`` of one shared encoder,
    ``a, b = features[:, 0], features[:, 1]``, then ``Linear(4·d_model -> hidden) -> ReLU -> Linear(hidden -> classes)``
    over ``[a, b, a·b, a−b]`` ``(B, 4·d_model)`` (the LRA / Nyströmformer dual-encoder classifier)."""

    def __init__(self, d_model: int, num_classes: int, hidden_dim: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4 * d_model, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, num_classes))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.dim() != 3 or features.shape[1] != 2:
            raise ValueError(
                f"PairHead expects features (B, 2, d_model) from two documents per item, got {tuple(features.shape)}; "
                "use it only with a two-document task (task=retrieval)"
            )
        a, b = features.unbind(1)
        return self.net(torch.cat([a, b, a * b, a - b], dim=-1))
