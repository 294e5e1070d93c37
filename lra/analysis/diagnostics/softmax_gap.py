"""How far a trained model's attention is from exact softmax attention on its own queries, keys and values.

    python -m lra.analysis.diagnostics.softmax_gap --data data/listops_full
        --ckpt RUN/checkpoints/best-1500.ckpt [RUN/checkpoints/interrupted-2122.ckpt ...]
        [--split val] [--batch 4] [--overrides attention=performer ...]

An efficient variant approximates ``softmax(q kᵀ/√d) v``; how well depends on the q and k training produces
(FAVOR+'s relative error grows like ``exp(‖q + k‖²/√d)``, a landmark method's error with the rank
of the scores). For each checkpoint (the model it was trained as, its stored settings; ``--overrides`` change
it) the script runs the first ``--batch`` sequences of ``basic_<split>.tsv``, captures what every layer's
variant receives and returns, and prints per layer:

* ``gap``: ``‖y − y*‖ / ‖y*‖`` over real queries, with ``y*`` exact softmax over real keys in float64;
* ``uniform``: the same for ``ȳ``, the mean of the real values (uniform attention): a gap above it means the
  variant's output is further from softmax's than plain averaging is;
* ``|q|²/√d``, ``|k|²/√d``: the median and largest over real tokens (the scale of the exponent);
* ``entropy``: the exact attention rows' mean entropy over ``log n_real`` (1 uniform, 0 one key).

A gap that grows between two checkpoints of one run, while the exponent scales grow, points at the approximation
rather than the optimiser (it does not prove it). Deterministic for given checkpoints and batch (random features are buffers).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from lra.analysis.diagnostics.cue_agreement import trained_model
from lra.analysis.diagnostics.root_attention import padded_batch
from lra.analysis.listops_cue import read_examples
from lra.tasks.listops import tokenize
from models.blocks import MultiHeadAttention


def exact_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``softmax(q kᵀ/√d) v`` ``(B, H, n, d)`` over the real keys of ``key_mask`` ``(B, n)``, and its
    weights ``(B, H, n, n)``."""
    q, k, v = q.double(), k.double(), v.double()
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    weights = scores.masked_fill(~key_mask[:, None, None, :], -torch.inf).softmax(-1)
    return weights @ v, weights


def layer_gap(q, k, v, key_mask, y) -> dict[str, float]:
    """The statistics the module docstring lists for one layer's call ``y = attend(q, k, v, key_mask)``."""
    exact, weights = exact_softmax(q, k, v, key_mask)
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
    return [layer_gap(*args, y) for _, args, y in calls]


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
