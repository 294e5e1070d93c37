"""Classification heads over pooled encoder features (DESIGN §3)."""

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
