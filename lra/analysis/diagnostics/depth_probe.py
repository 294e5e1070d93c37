"""Does a trained ListOps model know each token's bracket depth? A linear probe of every block's token outputs.

    python -m lra.analysis.diagnostics.depth_probe --data data/listops_full --ckpt RUN/checkpoints/best-3000.ckpt
        [--split val] [--examples 100] [--overrides attention=curformer ...]

Passing the first-operator cue takes the root's own digits (``python -m lra.analysis.listops_shallow``), and
telling them from deeper ones takes the bracket depth of each token: a count over the prefix (``[OP`` opens,
``]`` closes). For the model ``--ckpt`` was trained as (its stored settings; ``--overrides`` change it) the
script takes the first ``--examples`` sequences of ``basic_<split>.tsv``, one at a time (no padding), collects
each block's output per real token ``(n, d_model)``, fits least squares with a bias on the first half of the
examples' tokens and prints the held-out R² on the second half for two targets: the depth, and "a digit at
depth 1" (0/1). R² near 1: the block's features hold the target linearly; near 0 or below: they do not.
Deterministic for a given checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lra.analysis.diagnostics.cue_agreement import add_model_arguments, trained_model
from lra.analysis.diagnostics.root_attention import padded_batch
from lra.analysis.listops_cue import OPERATORS, read_examples
from lra.tasks.listops import TOKEN_IDS, tokenize

OPENING_IDS = frozenset(TOKEN_IDS[operator] for operator in OPERATORS)
CLOSING_ID = TOKEN_IDS["X"]
DIGIT_IDS = frozenset(TOKEN_IDS[str(digit)] for digit in range(10))


def bracket_depths(ids: list[int]) -> torch.Tensor:
    """Depth ``(n,)`` of every token: an operator and its closing ``]`` sit at the depth of the bracket they
    open or close (the root's at 1), an argument at the depth of the bracket that holds it."""
    depths, depth = [], 0
    for token in ids:
        depth += token in OPENING_IDS
        depths.append(depth)
        depth -= token == CLOSING_ID
    return torch.tensor(depths, dtype=torch.float)


def root_digits(ids: list[int]) -> torch.Tensor:
    """``(n,)`` 1.0 where the token is a digit argument of the root operator (depth 1), else 0.0."""
    is_digit = torch.tensor([token in DIGIT_IDS for token in ids])
    return (is_digit & (bracket_depths(ids) == 1)).float()


@torch.no_grad()
def block_outputs(model, ids: list[int]) -> list[torch.Tensor]:
    """Each block's output for one sequence, ``(n, d_model)`` per block (forward hooks; no padding)."""
    outputs: list[torch.Tensor] = []
    hooks = [block.register_forward_hook(lambda module, args, out: outputs.append(out[0])) for block in model.blocks]
    try:
        model(*padded_batch([ids]))
    finally:
        for hook in hooks:
            hook.remove()
    return outputs


def held_out_r2(features: torch.Tensor, target: torch.Tensor, fit_rows: int) -> float:
    """Least squares ``target ≈ [features, 1] w`` on rows ``:fit_rows``; R² of that fit on the rows after them."""
    design = torch.cat([features.double(), torch.ones(len(features), 1, dtype=torch.double)], 1)
    target = target.double()
    weights = torch.linalg.lstsq(design[:fit_rows], target[:fit_rows, None]).solution
    residual = target[fit_rows:] - (design[fit_rows:] @ weights)[:, 0]
    spread = target[fit_rows:] - target[fit_rows:].mean()
    return 1.0 - (residual.square().sum() / spread.square().sum()).item()


def probe(model, sequences: list[list[int]]) -> dict[str, list[float]]:
    """Held-out R² per block for ``depth`` and ``root_digit``; the first half of ``sequences`` fits the probe."""
    per_sequence = [block_outputs(model, ids) for ids in sequences]
    per_block = [torch.cat(states) for states in zip(*per_sequence)]  # (tokens of all sequences, D) per block
    fit_rows = sum(len(ids) for ids in sequences[: len(sequences) // 2])
    targets = {"depth": torch.cat([bracket_depths(ids) for ids in sequences]),
               "root_digit": torch.cat([root_digits(ids) for ids in sequences])}
    return {name: [held_out_r2(features, target, fit_rows) for features in per_block]
            for name, target in targets.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a ListOps folder with basic_<split>.tsv")
    parser.add_argument("--split", default="val", choices=["train", "val", "test"])
    parser.add_argument("--examples", type=int, default=100, help="sequences probed: half fit, half score (≥ 2)")
    add_model_arguments(parser)
    args = parser.parse_args()
    if args.examples < 2:
        parser.error(f"--examples {args.examples}: needs at least 2 (one to fit the probe, one to score it)")
    path = Path(args.data) / f"basic_{args.split}.tsv"
    sequences = [tokenize(source) for source, _ in read_examples(path)[: args.examples]]
    model = trained_model(args.ckpt, args.overrides)
    print(f"{args.ckpt} on the first {len(sequences)} examples of {path}: held-out R² of a linear probe per block")
    for name, scores in probe(model, sequences).items():
        print(f"  {name:10s} " + "  ".join(f"block {j}: {r2:.3f}" for j, r2 in enumerate(scores)))


if __name__ == "__main__":
    main()
