"""The ListOps generator (Nangia & Bowman 2018; LRA release ``listops-1000``), after the official ``listops.py``
(docs/design.md §4 "ListOps"). Operators ``[MIN [MAX [MED [SM`` over digits 0-9, max depth 10, at most 10 arguments;
below max depth a node is a leaf with probability 0.75, otherwise an operator with ``randint(2, max_args)`` children.
Length counts values plus 2 per operator; trees are kept when ``min_length < length < max_length`` and unique.
**Decision:** the generator is seeded and the vocabulary order is fixed (the official split and token ids are not
reproducible).

    python -m lra.tasks.listops generate --out data/listops --train 96000 --val 2000 --test 2000 --seed 0

The command runs through :mod:`lra.tasks.listops` (the reader and DataModule) because each generated folder records it
(:data:`GENERATOR`, in ``generated.json``) and a folder recording another command would look foreign. ``generate``
writes only into an empty or absent folder, or over the files it wrote itself with the same settings
(:mod:`lra.tasks.generated`); any other file there makes it refuse, naming the file.

Full-size generation also writes ``basic_independent_test.tsv`` (20,000 examples by default, ``--independent-test 0``
to skip): drawn after the three official splits from the same seeded stream, so it is disjoint from all of them and
leaves them unchanged. This module imports no torch.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from tqdm import tqdm

from lra.tasks.files import atomic_write_text
from lra.tasks.generated import GenerationRefused, Manifest, digest, foreign_file
from lra.tasks.listops_vocab import INDEPENDENT_TEST, OPERATORS

LEAF_PROBABILITY = 0.75
HEADER = "Source\tTarget"


def generate_tree(rng: random.Random, depth: int, max_depth: int, max_args: int) -> tuple[object, int]:
    """Return ``(tree, length)``; a tree is a digit or ``(operator, [children])``."""
    if depth < max_depth and rng.random() < 1 - LEAF_PROBABILITY:
        children, length = [], 2
        for _ in range(rng.randint(2, max_args)):
            child, child_length = generate_tree(rng, depth + 1, max_depth, max_args)
            children.append(child)
            length += child_length
        return (rng.choice(OPERATORS), children), length
    return rng.randrange(10), 1


# An operator's value from its arguments' values: MIN, MAX, MED = int(median) (truncating), SM = sum mod 10.
APPLY = {
    "[MIN": min,
    "[MAX": max,
    "[MED": lambda values: int(statistics.median(values)),
    "[SM": lambda values: sum(values) % 10,
}


def evaluate(tree: object) -> int:
    """Value of a tree (:data:`APPLY` at each operator)."""
    if isinstance(tree, int):
        return tree
    operator, children = tree
    return APPLY[operator]([evaluate(child) for child in children])


def to_string(tree: object) -> str:
    """The official bracketing: ``( ( ( [MAX 2 ) 9 ) ] )`` for ``[MAX 2 9 ]``."""
    if isinstance(tree, int):
        return str(tree)
    operator, children = tree
    text = operator
    for child in children:
        text = f"( {text} {to_string(child)} )"
    return f"( {text} ] )"


GENERATOR = "python -m lra.tasks.listops generate"


def generate_command(out: Path | str, sizes: dict[str, int], seed: int, min_length: int = 500, max_length: int = 2000,
                     max_depth: int = 10, max_args: int = 10) -> str:
    """The command line that runs :func:`generate` with these settings."""
    return (f"{GENERATOR} --out {out} --train {sizes.get('train', 0)} --val {sizes.get('val', 0)} --test {sizes.get('test', 0)} "
            f"--independent-test {sizes.get(INDEPENDENT_TEST, 0)} --seed {seed} --min-length {min_length} "
            f"--max-length {max_length} --max-depth {max_depth} --max-args {max_args}")


def generate(
    out: Path, sizes: dict[str, int], seed: int, min_length: int = 500, max_length: int = 2000,
    max_depth: int = 10, max_args: int = 10,
) -> None:
    """Write ``out/basic_<split>.tsv`` for each split of ``sizes`` (in its order), examples unique across all
    splits, each of ``min_length < length < max_length``.

    Refuses (:class:`GenerationRefused`, before writing anything) when ``out`` holds a file that a generation with
    these settings did not write (:func:`lra.tasks.generated.foreign_file`). Each file is written whole or not at all
    (a temporary file renamed into place), its hash recorded in ``out/generated.json`` first, so a killed run never
    leaves a truncated split that looks complete, and the next run with the same settings takes over its folder."""
    out, sizes = Path(out), {split: int(count) for split, count in sizes.items()}
    settings = dict(sizes=sizes, seed=seed, min_length=min_length, max_length=max_length, max_depth=max_depth, max_args=max_args)
    recorded = {**settings, "sizes": [[split, count] for split, count in sizes.items()]}  # the split order matters too
    found = foreign_file(out, GENERATOR, recorded)
    if found is not None:
        raise GenerationRefused(out, *found, command=generate_command(out.with_name(out.name + "-generated"), **settings))
    out.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(out, GENERATOR, recorded)
    rng = random.Random(seed)
    seen: set[str] = set()
    with tqdm(total=sum(sizes.values()), desc=f"ListOps -> {out}", unit="ex") as progress:
        for split, count in sizes.items():
            rows = []
            while len(rows) < count:
                tree, length = generate_tree(rng, 1, max_depth, max_args)
                if not min_length < length < max_length:
                    continue
                source = to_string(tree)
                if source in seen:
                    continue
                seen.add(source)
                rows.append(f"{source}\t{evaluate(tree)}")
                progress.update()
            name, text = f"basic_{split}.tsv", "\n".join([HEADER, *rows]) + "\n"
            text_digest = digest(text.encode())
            if not manifest.holds(name, text_digest):  # the same bytes already there keep their mtime (and caches)
                manifest.record(name, text_digest)
                atomic_write_text(out / name, text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lra.tasks.listops", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="write basic_{train,val,test,independent_test}.tsv in the official format")
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--train", type=int, default=96000)
    gen.add_argument("--val", type=int, default=2000)
    gen.add_argument("--test", type=int, default=2000)
    gen.add_argument("--independent-test", type=int, default=20000,
                     help="size of basic_independent_test.tsv, drawn after the other splits (0: not written)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--min-length", type=int, default=500)
    gen.add_argument("--max-length", type=int, default=2000)
    gen.add_argument("--max-depth", type=int, default=10)
    gen.add_argument("--max-args", type=int, default=10)
    commands.add_parser("cue", help="moved: python -m lra.analysis.listops_cue DIR", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "cue":
        parser.exit(2, "the cue probe moved: run 'python -m lra.analysis.listops_cue DIR'\n")
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    sizes = {"train": args.train, "val": args.val, "test": args.test}
    if args.independent_test > 0:
        sizes[INDEPENDENT_TEST] = args.independent_test
    try:
        generate(
            args.out, sizes, seed=args.seed,
            min_length=args.min_length, max_length=args.max_length, max_depth=args.max_depth, max_args=args.max_args,
        )
    except GenerationRefused as refused:
        parser.exit(1, f"{parser.prog}: {refused}\n")
