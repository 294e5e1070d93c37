"""Why ListOps stayed at chance: activation and update scales at initialisation, old vs reference recipe.

    python -m lra.analysis.diagnostics.recipe_scales --data data/listops_1k [--batch 8] [--overrides attention=curformer]

For each embedding initialisation (PyTorch's N(0, 1) vs the reference N(0, 0.02²)) it builds the
configured model, runs one batch of real ListOps through it and prints, per layer, the RMS of the
residual stream and of each block's attention and FFN branches, how much of the final stream the
blocks contributed, and Adam's relative step lr / RMS(θ) for the embeddings (Adam moves every
element by about lr per step whatever the gradient's scale, so a tensor initialised 50× larger
learns 50× slower relative to itself). Numbers are deterministic for a given seed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lra.config import compose_config
from lra.analysis.diagnostics.root_attention import padded_batch
from lra.build import build_model
from lra.tasks.listops import read_tsv


def rms(x: torch.Tensor) -> float:
    return x.pow(2).mean().sqrt().item()


def branch_scales(model, input_ids: torch.Tensor, key_mask: torch.Tensor) -> list[str]:
    """One line per layer: RMS of the stream entering it and of its attention / FFN branches."""
    lines = []
    with torch.no_grad():
        x0 = x = model.embed(input_ids)
        for index, block in enumerate(model.blocks):
            attn = block.attn(block.norm1(x), key_mask)
            ffn = block.ffn(block.norm2(x + attn))
            lines.append(f"  layer {index}: stream {rms(x):.3f}  attention branch {rms(attn):.3f}  FFN branch {rms(ffn):.3f}")
            x = x + attn + ffn
        lines.append(f"  blocks' share of the final stream ||x_L - x_0|| / ||x_L|| = {(x - x0).norm() / x.norm():.3f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a ListOps folder with basic_train.tsv")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--overrides", nargs="*", default=["attention=curformer"])
    args = parser.parse_args()
    sequences, _ = read_tsv(Path(args.data) / "basic_train.tsv")
    input_ids, key_mask = padded_batch(sequences[: args.batch])
    batch, n = input_ids.shape
    for std in ("null", "0.02"):
        torch.manual_seed(0)
        cfg = compose_config(["task=listops", f"task.max_length={n}", "model.dropout=0", *args.overrides,
                              f"model.embedding_init_std={std}"])
        model = build_model(cfg).eval()
        lr = cfg.optimizer.lr
        print(f"embedding_init_std={std} (n = {n}, batch {batch}, lr {lr:g})")
        print("\n".join(branch_scales(model, input_ids, key_mask)))
        for name in ("token_embedding", "position_embedding"):
            weight = getattr(model, name).weight
            print(f"  {name}: RMS {rms(weight):.4f}, Adam relative step lr/RMS = {lr / rms(weight):.1e}")


if __name__ == "__main__":
    main()
