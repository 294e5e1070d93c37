"""How much attention every ListOps token pays to the root operator (key 0), per layer and attention variant.

    python -m lra.analysis.diagnostics.root_attention --data data/listops_full [--ckpt RUN/checkpoints/best-2750.ckpt]
        [--batch 8] [--variants attention=softmax "attention=curformer attention.force_cls=true" ...]

ListOps' label is mostly decided by its first token, the root operator (``python -m lra.tasks.listops
cue``); with mean pooling a model can only use it if attention carries key 0's value to the other
tokens. For each variant (a string of Hydra overrides) the script builds the model, loads ``--ckpt``'s
weights if given (softmax and CUR have no parameters of their own, so one checkpoint loads under
either; variants with parameters such as Proxyformer need a checkpoint of their own), runs the
first ``--batch`` validation sequences and materialises each layer's *effective* attention matrix (the
attention applied to ``V = I``: CUR's ``C U⁺ R``, Proxyformer's ``K₁ K₂``, exact softmax; for MEGA and
MegaCUR, ``--variants attention=megacur`` with a MEGA-block checkpoint, the single-head core of the gated
attention). It prints the mean weight a real query puts on key 0, times the sequence's real length: 1 means
uniform attention, ``n`` means every query looks only at the root operator. A variant whose output is no per-head
linear map of ``V`` (Luna, DBA, Set Transformer) gets its reason on its line instead, and the next variant runs.
Deterministic for a given checkpoint and batch.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import torch

from lra.config import compose_config
from lra.runtime.checkpoints import load_transferred_weights, with_checkpoint_settings
from lra.build import build_model
from lra.tasks.base import SplitDataset, collate
from lra.tasks.listops import read_tsv
from lra.tasks.splits import TokenizedSplit
from attention.mega import MegaAttention
from models.blocks import MultiHeadAttention

DEFAULT_VARIANTS = ["attention=softmax", "attention=curformer", "attention=curformer attention.force_cls=true",
                    "attention=curformer attention.selection=step"]


def padded_batch(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``(B, n)`` and real-token mask, padded as training batches are (``TokenizedSplit`` + ``collate``)."""
    dataset = SplitDataset(TokenizedSplit.from_sequences(sequences, [0] * len(sequences), max(map(len, sequences))))
    batch = collate([dataset[i] for i in range(len(dataset))])
    return batch["input_ids"], batch["mask"]


def effective_attention(layer, args: tuple) -> torch.Tensor:
    """The attention matrix ``(B, H, n, n)`` a probed layer applied in the call that received ``args``."""
    if isinstance(layer, MegaAttention):  # called as attend(q, k, v, key_mask) by the MEGA block, one head
        return layer.attention_matrix(*args)
    return layer.attention_matrix(*args[:2])  # (x, key_mask, ...) of a multi-head attention layer


@torch.no_grad()
def root_weights(model, input_ids: torch.Tensor, key_mask: torch.Tensor) -> list[float]:
    """Per attention layer: mean over sequences and heads of (mean weight of a real query on key 0) × n_real.

    Runs the model once and captures what each attention layer receives: a
    :class:`models.blocks.MultiHeadAttention` (or subclass, such as Proxyformer's, whose layers also see the
    proxy rows), or the single-head core :class:`attention.mega.MegaAttention` of MEGA's gated attention (EMA
    and gates around it are not attention and are not probed); then asks it for its ``attention_matrix``."""
    layer_inputs = []
    layers = [module for module in model.modules() if isinstance(module, (MultiHeadAttention, MegaAttention))]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no attention layer to probe "
                         "(models.blocks.MultiHeadAttention or attention.mega.MegaAttention)")
    hooks = [layer.register_forward_hook(lambda layer, args, _: layer_inputs.append((layer, args))) for layer in layers]
    try:
        model.token_states(input_ids, key_mask, {})
    finally:
        for hook in hooks:
            hook.remove()
    n_real = key_mask.sum(1, keepdim=True).float()  # (B, 1)
    real = key_mask[:, None, :]  # (B, 1, n)
    ratios = []
    for layer, args in layer_inputs:
        if args[0].shape[0] != input_ids.shape[0]:
            raise ValueError("root_attention probes whole sequences: a chunked MEGA attention sees chunks "
                             "(override model.block.chunk_size=null)")
        on_root = effective_attention(layer, args)[..., 0]  # (B, H, n): weight of each query on key 0
        mean_on_root = (on_root * real).sum(-1) / real.sum(-1)  # (B, H)
        ratios.append((mean_on_root * n_real).mean().item())
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a ListOps folder with basic_val.tsv")
    parser.add_argument("--ckpt", help="a training checkpoint (.ckpt); default: the models at initialisation")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, help="each a string of Hydra overrides")
    args = parser.parse_args()
    sequences, _ = read_tsv(Path(args.data) / "basic_val.tsv")
    input_ids, key_mask = padded_batch(sequences[: args.batch])
    print(f"{args.ckpt or 'initialisation'}: {args.batch} validation sequences, n ≤ {input_ids.shape[1]}")
    for variant in args.variants:
        torch.manual_seed(0)
        overrides = ["model.dropout=0", *shlex.split(variant)]
        config = compose_config(["task=listops", *overrides])
        if args.ckpt:  # the stored model settings (positions, ...) unless the variant names them; its attention
            config = with_checkpoint_settings(config, overrides, args.ckpt)
        model = build_model(config).eval()
        if args.ckpt:
            load_transferred_weights(model, args.ckpt)
        try:
            ratios = root_weights(model, input_ids, key_mask)
        except ValueError as refusal:  # no n × n matrix to read (Luna, DBA, Set Transformer): the reason, then the next
            print(f"  {variant:50s} refused: {refusal}")
            continue
        print(f"  {variant:50s} " + "  ".join(f"layer {i}: {r:7.2f}" for i, r in enumerate(ratios)))


if __name__ == "__main__":
    main()
