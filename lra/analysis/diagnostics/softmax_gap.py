"""How far a trained model's attention is from exact softmax attention on its own queries, keys and values.

    python -m lra.analysis.diagnostics.softmax_gap --data data/listops_full
        --ckpt RUN/checkpoints/best-1500.ckpt [RUN/checkpoints/interrupted-2122.ckpt ...]
        [--split val] [--batch 4] [--overrides attention=performer ...]

An efficient variant approximates an exact attention, most of them ``softmax(q kᵀ/√d) v``; how well depends on
the q and k training produces (FAVOR+'s relative error grows like ``exp(‖q + k‖²/√d)``, a landmark method's error
with the rank of the scores). For each checkpoint (the model it was trained as, its stored settings; ``--overrides``
change it) the script runs the first ``--batch`` sequences of ``basic_<split>.tsv``, captures what every layer's
variant receives and returns, and prints per layer:

* ``gap``: ``‖y − y*‖ / ‖y*‖`` over real queries, with ``y*`` the exact attention over real keys in float64
  (:func:`exact_attention`: the variant's own score where it has one, so L1 distance for ``l1`` and ``l1_cur``,
  and Reformer's shared-QK softmax; ``softmax(q kᵀ/√d)`` for every other variant);
* ``uniform``: the same for ``ȳ``, the mean of the real values (uniform attention): a gap above it means the
  variant's output is further from the exact attention's than plain averaging is;
* ``|q|²/√d``, ``|k|²/√d``: the median and largest over real tokens (the scale of the exponent; ``k`` the keys
  the exact attention scores, Reformer's unit queries);
* ``entropy``: the exact attention rows' mean entropy over ``log n_real`` (1 uniform, 0 one key).

A gap that grows between two checkpoints of one run, while the exponent scales grow, points at the approximation
rather than the optimiser (it does not prove it). Deterministic for given checkpoints and batch (random features are buffers).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attention.reformer import SELF_PENALTY, ReformerAttention
from lra.analysis.diagnostics.cue_agreement import trained_model
from lra.analysis.diagnostics.root_attention import padded_batch
from lra.analysis.listops_cue import read_examples
from lra.tasks.listops import tokenize
from models.blocks import MultiHeadAttention


def exact_attention(core: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The float64 dense attention ``core`` approximates on ``q, k, v`` ``(B, H, n, d)`` over the real keys of
    ``key_mask`` ``(B, n)``: its output and weights ``(B, H, n, n)``, and the keys it scores ``(B, H, n, d)``.

    * a variant with a score module (``core.score``: CUR's, Nyström's and L1 attention's,
      :mod:`attention.scores`) is compared with that score's softmax, so L1 distance for ``l1`` and ``l1_cur``;
    * Reformer reads no ``k``: its keys are the unit queries ``q_j/‖q_j‖`` and a token weighs itself 0 unless it
      has no other key (:mod:`attention.reformer`, the paper's shared-QK attention with every pair in reach);
    * every other variant: ``softmax(q kᵀ/√d)``.
    """
    q, k, v = q.double(), k.double(), v.double()
    keys = key_mask[:, None, None, :]
    score = getattr(core, "score", None)
    if isinstance(score, nn.Module):
        weights = score(q, k, keys)
    else:
        bias = torch.zeros((), dtype=q.dtype)
        if isinstance(core, ReformerAttention):
            k = F.normalize(q, dim=-1)
            bias = -SELF_PENALTY * torch.eye(q.shape[-2], dtype=q.dtype)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + bias
        weights = scores.masked_fill(~keys, -torch.inf).softmax(-1)
    return weights @ v, weights, k


def layer_gap(core: nn.Module, q, k, v, key_mask, y) -> dict[str, float]:
    """The statistics the module docstring lists for one layer's call ``y = core(q, k, v, key_mask)``."""
    exact, weights, k = exact_attention(core, q, k, v, key_mask)
    real = key_mask[:, None, :, None]  # (B, 1, n, 1): real queries
    gap = ((y.double() - exact) * real).norm() / (exact * real).norm()
    mean_value = (v.double() * real).sum(-2, keepdim=True) / real.sum(-2, keepdim=True)  # (B, H, 1, d): ȳ
    uniform = ((mean_value - exact) * real).norm() / (exact * real).norm()
    scale = math.sqrt(q.shape[-1])
    real_tokens = key_mask[:, None, :].expand(q.shape[:3])  # (B, H, n)
    q_norms = (q.double().square().sum(-1) / scale)[real_tokens]
    k_norms = (k.double().square().sum(-1) / scale)[real_tokens]
    entropy = -(weights * weights.clamp_min(1e-300).log()).sum(-1)  # (B, H, n)
    n_real = key_mask.sum(-1).double()[:, None, None]  # (B, 1, 1)
    normalised = (entropy / n_real.clamp_min(2).log())[real_tokens]
    return {"gap": gap.item(), "uniform": uniform.item(), "q_median": q_norms.median().item(), "q_max": q_norms.max().item(),
            "k_median": k_norms.median().item(), "k_max": k_norms.max().item(), "entropy": normalised.mean().item()}


@torch.no_grad()
def softmax_gaps(model, input_ids: torch.Tensor, key_mask: torch.Tensor) -> list[dict[str, float]]:
    """:func:`layer_gap` of every :class:`models.blocks.MultiHeadAttention` layer's variant, in model order."""
    calls = []
    cores = [layer.attend for layer in model.modules() if isinstance(layer, MultiHeadAttention)]
    if not cores:
        raise ValueError(f"{type(model).__name__} has no models.blocks.MultiHeadAttention layer to compare")
    hooks = [core.register_forward_hook(lambda core, args, y: calls.append((core, args, y))) for core in cores]
    try:
        model(input_ids, key_mask)
    finally:
        for hook in hooks:
            hook.remove()
    for core, args, _ in calls:
        if len(args) != 4 or args[0].shape[-2] != args[3].shape[-1]:
            raise ValueError(f"softmax_gap compares variants called as attend(q, k, v, key_mask) on the sequence's own "
                             f"tokens; {type(core).__name__} is called otherwise (extra rows or arguments)")
    return [layer_gap(core, *args, y) for core, args, y in calls]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a ListOps folder with basic_<split>.tsv")
    parser.add_argument("--split", default="val", choices=["val", "test"])
    parser.add_argument("--batch", type=int, default=4, help="sequences (float64 n × n weights per head)")
    parser.add_argument("--ckpt", nargs="+", required=True, help="training checkpoints (.ckpt), compared in order")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="Hydra overrides of the model, as in lra.analysis.diagnostics.cue_agreement")
    args = parser.parse_args()
    examples = read_examples(Path(args.data) / f"basic_{args.split}.tsv")[: args.batch]
    input_ids, key_mask = padded_batch([tokenize(source) for source, _ in examples])
    print(f"{len(examples)} {args.split} sequences, n ≤ {input_ids.shape[1]}; |q|², |k|² over √d: median / max")
    for ckpt in args.ckpt:
        print(ckpt)
        for index, s in enumerate(softmax_gaps(trained_model(ckpt, args.overrides), input_ids, key_mask)):
            print(f"  layer {index}: gap {s['gap']:.3f} (uniform {s['uniform']:.3f})  |q|² {s['q_median']:6.2f} / {s['q_max']:6.2f}"
                  f"  |k|² {s['k_median']:6.2f} / {s['k_max']:6.2f}  entropy {s['entropy']:.3f}")


if __name__ == "__main__":
    main()
