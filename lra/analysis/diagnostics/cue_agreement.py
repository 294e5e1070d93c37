"""Does a trained ListOps model predict more than the first-operator cue? Compare their test predictions.

    python -m lra.analysis.diagnostics.cue_agreement --data data/listops_full --ckpt RUN/checkpoints/best-3500.ckpt
        [--split test] [--batch 32] [--overrides attention=curformer ...]

The cue (:mod:`lra.analysis.listops_cue`) predicts the most frequent training label of each root operator.
For the model (``--ckpt``'s weights in the model it was trained as, from the settings the checkpoint stores;
``--overrides`` change it, and name the model of a checkpoint without settings) the script prints its
accuracy on ``basic_<split>.tsv``, the cue's, how often the two predict the same label, and the
model's accuracy on the examples the cue gets wrong, and per root operator the model's most frequent
prediction and its share: a model that learned only the shortcut predicts one label per operator
(its own rule, which may differ from the cue's) and is right where the cue is wrong no more often than chance.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lra.config import compose_config
from lra.runtime.checkpoints import load_transferred_weights, with_checkpoint_settings
from lra.analysis.diagnostics.root_attention import padded_batch
from lra.build import build_model
from lra.tasks.listops import tokenize
from lra.analysis.listops_cue import OPERATORS, first_operator, fit, read_examples


@torch.no_grad()
def predict(model, sequences: list[list[int]], batch: int) -> torch.Tensor:
    """Argmax labels ``(N,)`` of ``model`` on token-id ``sequences``, ``batch`` at a time (sorted by length)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    labels = torch.empty(len(sequences), dtype=torch.long)
    for start in range(0, len(order), batch):
        chosen = order[start : start + batch]
        input_ids, key_mask = padded_batch([sequences[i] for i in chosen])
        logits, _ = model(input_ids, key_mask)
        labels[chosen] = logits.argmax(-1)
    return labels


def compare(model_labels: torch.Tensor, cue_labels: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Accuracies of model and cue, their agreement, and the model's accuracy where the cue is wrong."""
    cue_wrong = cue_labels != targets
    return {
        "model_acc": (model_labels == targets).float().mean().item(),
        "cue_acc": (cue_labels == targets).float().mean().item(),
        "agreement": (model_labels == cue_labels).float().mean().item(),
        "model_acc_where_cue_wrong": (model_labels[cue_wrong] == targets[cue_wrong]).float().mean().item(),
        "cue_wrong": int(cue_wrong.sum()),
    }


def labels_per_operator(model_labels: torch.Tensor, operators: list[str]) -> dict[str, tuple[int, float, int]]:
    """Per root operator present: (the model's most frequent label, its share of those examples, count)."""
    table = {}
    for operator in OPERATORS:
        chosen = model_labels[[i for i, op in enumerate(operators) if op == operator]]
        if len(chosen):
            counts = torch.bincount(chosen, minlength=10)
            table[operator] = (int(counts.argmax()), counts.max().item() / len(chosen), len(chosen))
    return table


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ckpt`` and ``--overrides``, read by :func:`trained_model` (shared by the ListOps probes)."""
    parser.add_argument("--ckpt", required=True, help="a training checkpoint (.ckpt)")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="Hydra overrides of the model; the attention and model groups the checkpoint stores "
                             "come from it unless named here (checkpoints without them need e.g. attention=curformer); "
                             "task=listops_small for a checkpoint trained on it (default task=listops)")


def trained_model(ckpt: str, overrides: list[str]):
    """The ListOps model ``ckpt`` was trained as (its stored settings, ``overrides`` winning), its weights loaded,
    in eval mode. The task (its ``max_length`` sizes learned positions) is ``task=listops`` unless ``overrides``
    name another: Hydra's later group override wins."""
    config = with_checkpoint_settings(compose_config(["task=listops", *overrides]), overrides, ckpt)
    model = build_model(config).eval()
    load_transferred_weights(model, ckpt)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a ListOps folder with basic_train.tsv and basic_<split>.tsv")
    parser.add_argument("--split", default="test", choices=["val", "test"])
    parser.add_argument("--batch", type=int, default=32)
    add_model_arguments(parser)
    args = parser.parse_args()
    data = Path(args.data)
    cue = fit(read_examples(data / "basic_train.tsv"))
    examples = read_examples(data / f"basic_{args.split}.tsv")
    model = trained_model(args.ckpt, args.overrides)
    model_labels = predict(model, [tokenize(source) for source, _ in examples], args.batch)
    cue_labels = torch.tensor([cue.predict(source) for source, _ in examples])
    targets = torch.tensor([label for _, label in examples])
    result = compare(model_labels, cue_labels, targets)
    print(f"{args.ckpt} on {data / f'basic_{args.split}.tsv'} ({len(examples)} examples):")
    print(f"  model {result['model_acc']:.2%}, cue {result['cue_acc']:.2%}, same label {result['agreement']:.2%}; "
          f"model right on {result['model_acc_where_cue_wrong']:.2%} of the {result['cue_wrong']} the cue gets wrong")
    operators = [first_operator(source) for source, _ in examples]
    for operator, (label, share, count) in labels_per_operator(model_labels, operators).items():
        print(f"  root {operator:4s} ({count:5d}): model predicts {label} on {share:.1%} (cue: {cue.rule[operator]})")


if __name__ == "__main__":
    main()
