"""Hash every variant's training-mode logits and gradients, to show that a refactor changed no number.

``python -m lra.bench fingerprint [--variants ...] [--out DIR]`` builds each attention config's full model
(``configs/train.yaml`` with ``task=listops``, 2 layers, dropout on), runs one training-mode forward and
backward on a fixed padded batch with seed 0, and prints one SHA-256 per variant over the bytes of the logits,
the auxiliary losses and every parameter gradient (sorted by name). Two checkouts that print the same hashes
on the same machine and thread count compute the same numbers bit for bit; different CPUs (AVX2 vs AVX-512)
may round differently, so compare hashes only from one machine. ``fingerprint.csv`` in the output folder
keeps them.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import torch

from lra.bench.common import default_out_dir, machine, machine_line, select_variants, setup_process, write_csv
from lra.config import compose_config
from lra.build import build_model

LENGTH = 96  # above the landmark count (64) so the CUR/Nyström selections choose, not take every row
BATCH = 3


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--length", type=int, default=LENGTH, help="tokens per example (the last example is half padding)")
    sub.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (hashes compare only at one count)")


def fingerprint(overrides: list[str], length: int) -> str:
    """SHA-256 of the logits, auxiliary losses and parameter gradients of one training step of the model."""
    cfg = compose_config(["task=listops", f"task.max_length={length}", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, cfg.task.vocab_size, (BATCH, length), generator=generator)
    mask = torch.ones(BATCH, length, dtype=torch.bool)
    mask[-1, length // 2:] = False
    ids[~mask] = 0
    logits, aux = model(ids, mask)
    loss = logits.float().logsumexp(-1).sum() + sum(aux.values(), torch.zeros(()))
    loss.backward()
    digest = hashlib.sha256(logits.detach().contiguous().numpy().tobytes())
    for name in sorted(aux):
        digest.update(aux[name].detach().float().contiguous().numpy().tobytes())
    for name, parameter in sorted(model.named_parameters()):
        if parameter.grad is not None:
            digest.update(name.encode())
            digest.update(parameter.grad.contiguous().numpy().tobytes())
    return digest.hexdigest()


def run(args: argparse.Namespace) -> None:
    setup_process(args.threads)
    rows = []
    for variant in select_variants(args.variants, args.variant_overrides):
        try:
            rows.append({"variant": variant.label, "sha256": fingerprint(variant.config_overrides(), args.length)})
        except (RuntimeError, ValueError) as error:  # FlashCUR without CUDA or the interpreter
            rows.append({"variant": variant.label, "sha256": f"skipped: {str(error).splitlines()[0]}"})
        print(f"{rows[-1]['variant']:<32} {rows[-1]['sha256']}", flush=True)
    path = write_csv(rows, ["variant", "sha256"], (Path(args.out) if args.out else default_out_dir()) / "fingerprint.csv")
    print(f"{machine_line(machine(torch.device('cpu')))}\nwrote {path}")
