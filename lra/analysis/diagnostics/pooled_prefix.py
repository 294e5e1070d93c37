"""How much of a ListOps model's prediction rides on the first tokens' final states: pool without them.

    python -m lra.analysis.diagnostics.pooled_prefix --data data/listops_full --ckpt RUN/checkpoints/best-2750.ckpt
        [--split val] [--examples 1000] [--drop 1 4 16 64 256] [--batch 32] [--overrides attention=megacur ...]

A model can read the root operator (token 0, the first-operator cue) without attention carrying it to
every query: if the first tokens' final states differ by root operator, they shift the pooled mean of
~1,000 otherwise exchangeable tokens, and the head can read that shift. For each ``K`` of ``--drop`` the
script pools the final states of every real token but the first ``K`` (the model's own pooling over a
key mask with those positions off), applies the head, and prints the accuracy on the first ``--examples``
of ``basic_<split>.tsv`` and the share of predictions that stay those of the whole sequence. A model that
reads the cue from the first tokens changes most predictions once they are left out; one that spreads
the root operator over every token (the escaped CUR runs broadcast key 0 by attention) changes few.
The model comes from ``--ckpt`` (and ``--overrides``) as in :mod:`lra.analysis.diagnostics.cue_agreement`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lra.analysis.diagnostics.cue_agreement import add_model_arguments, trained_model
from lra.analysis.diagnostics.root_attention import padded_batch
from lra.analysis.listops_cue import read_examples
from lra.tasks.listops import tokenize


def pooled_without_prefix(model, states: torch.Tensor, key_mask: torch.Tensor, k: int) -> torch.Tensor:
    """The model's pooling ``(B, d_model)`` of final ``states`` ``(B, n, d_model)`` over the real tokens of
    ``key_mask`` ``(B, n)`` but the first ``k``."""
    kept = key_mask.clone()
    kept[:, :k] = False
    return model.pool(states, kept)


@torch.no_grad()
def predictions_without_prefix(model, sequences: list[list[int]], drops: list[int], batch: int) -> dict[int, torch.Tensor]:
    """``{K: argmax labels (N,)}`` for ``K = 0`` (the whole sequence) and each ``K`` of ``drops``: the head on
    the model's pooling of the final states with the first ``K`` positions masked out."""
    shortest = min(map(len, sequences))
    if max(drops, default=0) >= shortest:
        raise ValueError(f"--drop {max(drops)} leaves no token of an example of {shortest} tokens: "
                         f"drop fewer than {shortest}")
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    labels = {k: torch.empty(len(sequences), dtype=torch.long) for k in [0, *drops]}
    for start in range(0, len(order), batch):
        chosen = order[start : start + batch]
        input_ids, key_mask = padded_batch([sequences[i] for i in chosen])
        states = model.token_states(input_ids, key_mask, {})  # (b, n, d_model)
        for k, out in labels.items():
            out[chosen] = model.head(pooled_without_prefix(model, states, key_mask, k)).argmax(-1)
    return labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a ListOps folder with basic_<split>.tsv")
    parser.add_argument("--split", default="val", choices=["val", "test"])
    parser.add_argument("--examples", type=int, default=1000, help="the first N examples of the split")
    parser.add_argument("--drop", type=int, nargs="+", default=[1, 4, 16, 64, 256], help="prefix lengths K to leave out")
    parser.add_argument("--batch", type=int, default=32)
    add_model_arguments(parser)
    args = parser.parse_args()
    if min(args.drop) < 1:
        parser.error(f"--drop takes prefix lengths >= 1, got {min(args.drop)}")
    path = Path(args.data) / f"basic_{args.split}.tsv"
    examples = read_examples(path)[: args.examples]
    model = trained_model(args.ckpt, args.overrides)
    labels = predictions_without_prefix(model, [tokenize(source) for source, _ in examples], args.drop, args.batch)
    targets = torch.tensor([label for _, label in examples])
    whole = labels[0]
    print(f"{args.ckpt} on the first {len(examples)} examples of {path}: accuracy {(whole == targets).float().mean():.2%}")
    for k in args.drop:
        print(f"  without the first {k:4d} tokens: accuracy {(labels[k] == targets).float().mean():.2%}, "
              f"same prediction as the whole sequence {(labels[k] == whole).float().mean():.2%}")


if __name__ == "__main__":
    main()
