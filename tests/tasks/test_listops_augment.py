"""task.augment: ListOps rewrites keep every example's value (checked by an independent stack evaluator), follow the
source's schedule, depend on (seed, epoch, index) alone, and touch the training split only."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch
from hydra.utils import instantiate

from lra.tasks import listops, listops_generator
from lra.tasks.splits import TokenizedSplit
from lra.tasks.listops_augment import AugmentedSplit, CollapseSubtrees, ShuffleArguments
from tests.conftest import compose_config
from tests.tasks.test_listops import evaluate_source

# Hand-built trees: every operator, even and odd argument counts, nesting to depth 4.
TREES = [
    ("[MIN", [3, ("[MAX", [1, 9]), 5]),                                   # 3
    ("[MED", [1, 2, 3, 8]),                                               # even: int(2.5) = 2
    ("[MAX", [("[MED", [2, 7]), 1]),                                      # MED(2, 7) = 4, not the upper middle 7
    ("[SM", [9, 9, ("[SM", [5, 6])]),                                     # (18 + 1) % 10 = 9
    ("[SM", [("[MIN", [("[MAX", [("[MED", [1, 2, 6]), 3]), 4, 8]), 7, ("[MED", [0, 9, 9, 4])]),
    ("[MED", [("[SM", [5, 5]), 9, ("[MIN", [7, ("[SM", [8, 8, 8])]), 3, 6]),
]


def ids_of(tree) -> list[int]:
    return listops.tokenize(listops_generator.to_string(tree))


def value_of(ids: list[int]) -> int:
    """The independent evaluator of tests/tasks/test_listops.py, on the ids written back as a source string."""
    return evaluate_source(" ".join("]" if listops.VOCAB[i] == "X" else listops.VOCAB[i] for i in ids))


def collapse(intercept: float, slope: float = 0.0) -> CollapseSubtrees:
    return CollapseSubtrees(example_probability=1.0, intercept=intercept, slope=slope)


@pytest.mark.parametrize("tree", TREES, ids=range(len(TREES)))
def test_collapse_keeps_the_value_of_hand_built_trees(tree):
    ids, value = ids_of(tree), listops_generator.evaluate(tree)
    assert value_of(ids) == value
    assert collapse(50.0)(ids, random.Random(0)) == [listops.TOKEN_IDS[str(value)]]  # every node: the value alone
    assert collapse(-50.0)(ids, random.Random(0)) == ids                              # no node
    lengths = set()
    for seed in range(200):  # each node with probability 1/2
        rewritten = collapse(0.0)(ids, random.Random(seed))
        assert value_of(rewritten) == value, (seed, rewritten)
        lengths.add(len(rewritten))
    operators = sum(token in range(listops.TOKEN_IDS["[MIN"], listops.TOKEN_IDS["X"]) for token in ids)
    assert min(lengths) == 1 and max(lengths) == len(ids) and len(lengths) > min(operators, 2)  # partial collapses too


def test_collapse_takes_the_evaluators_median_and_counts_the_root_as_depth_one():
    # sigmoid(-100 + 60 d): never the root (d = 1), always a child (d = 2)
    ids = ids_of(("[MAX", [("[MED", [2, 7]), 1, ("[SM", [("[MIN", [5, 6]), 9])]))
    assert collapse(-100.0, 60.0)(ids, random.Random(0)) == ids_of(("[MAX", [4, 1, 4]))


def test_the_default_schedule_is_the_sources():
    """configs/task/listops.yaml: sigmoid(-8 + 0.5 d') with the source's d' = depth + 1, an example with p 0.6."""
    augmentations = instantiate(compose_config(["task=listops_small"]).task.augmentations)
    chosen = augmentations["collapse"]
    assert chosen.example_probability == 0.6 and augmentations["shuffle"].example_probability == 1.0
    for depth in range(1, 11):
        assert chosen.probability(depth) == pytest.approx(1 / (1 + math.exp(8 - 0.5 * (depth + 1))))


def canonical(tree):
    """The tree with every operator's arguments sorted: equal for trees that differ only in argument order."""
    if isinstance(tree, int):
        return str(tree)
    operator, children = tree
    return f"{operator} {' '.join(sorted(canonical(child) for child in children))} ]"


def tree_of(ids: list[int]):
    stack = [[]]
    for token in ids:
        name = listops.VOCAB[token]
        if name.startswith("["):
            stack.append([name])
        elif name == "X":
            operator, *children = stack.pop()
            stack[-1].append((operator, children))
        else:
            stack[-1].append(int(name))
    (tree,) = stack[0]
    return tree


@pytest.mark.parametrize("tree", TREES, ids=range(len(TREES)))
def test_shuffle_reorders_arguments_only(tree):
    ids, orders = ids_of(tree), set()
    for seed in range(50):
        rewritten = ShuffleArguments(example_probability=1.0)(ids, random.Random(seed))
        assert canonical(tree_of(rewritten)) == canonical(tree) and value_of(rewritten) == listops_generator.evaluate(tree)
        orders.add(tuple(rewritten))
    assert len(orders) > 1


@pytest.fixture(scope="module")
def train_split(tmp_path_factory) -> tuple[TokenizedSplit, str]:
    out = tmp_path_factory.mktemp("augment")
    listops_generator.generate(out, {"train": 120, "val": 1, "test": 1}, seed=3, min_length=10, max_length=90)
    sequences, labels = listops.read_tsv(out / "basic_train.tsv")
    return TokenizedSplit.from_sequences(sequences, labels, 90), str(out / "basic_train.tsv")


@pytest.mark.parametrize("augmentation", [CollapseSubtrees(0.9, -1.0, 0.3), ShuffleArguments(1.0)], ids=["collapse", "shuffle"])
def test_every_rewritten_training_example_keeps_its_label(train_split, augmentation):
    split, source = train_split
    dataset = AugmentedSplit(split, augmentation, seed=0, source=source)
    changed = 0
    for epoch in range(3):
        for index in range(len(dataset)):
            ids, length, label = dataset[(epoch, index)]
            original = split.ids[index, : split.lengths[index]].tolist()
            tokens = ids[:length].tolist()
            assert value_of(tokens) == int(label) == int(split.labels[index])
            assert length <= split.lengths[index] and not ids[length:].any()
            changed += tokens != original
    assert changed > len(dataset)  # most examples rewritten, in each epoch


def test_a_rewrite_depends_on_seed_epoch_and_index_only(train_split):
    split, source = train_split
    make = lambda seed: AugmentedSplit(split, CollapseSubtrees(1.0, -1.0, 0.3), seed=seed, source=source)
    keys = [(epoch, index) for epoch in range(2) for index in range(len(split))]
    forward = {key: make(0)[key][0] for key in keys}
    backward = {key: make(0)[key][0] for key in reversed(keys)}  # another instance, another order
    assert all(torch.equal(forward[key], backward[key]) for key in keys)
    epochs_differ = sum(not torch.equal(forward[(0, i)], forward[(1, i)]) for i in range(len(split)))
    seeds_differ = sum(not torch.equal(forward[(0, i)], make(1)[(0, i)][0]) for i in range(len(split)))
    assert epochs_differ > len(split) // 2 and seeds_differ > len(split) // 2


def test_examples_cut_by_max_length_are_refused_naming_the_key(train_split):
    split, source = train_split
    longest = int(split.lengths.max())
    cut = TokenizedSplit(split.ids[:, : longest - 5], split.lengths.clamp(max=longest - 5), split.labels)
    with pytest.raises(ValueError, match=rf"an operator is left open .*task.max_length={longest - 5}"):
        AugmentedSplit(cut, ShuffleArguments(1.0), seed=0, source=source)
    unknown = TokenizedSplit(split.ids.clone(), split.lengths, split.labels)
    unknown.ids[7, 1] = listops.TOKEN_IDS["<unk>"]
    with pytest.raises(ValueError, match="train example 7 .* a token outside the ListOps vocabulary"):
        AugmentedSplit(unknown, ShuffleArguments(1.0), seed=0, source=source)


def batches(loader) -> list[dict]:
    return [{key: value.clone() for key, value in batch.items()} for batch in loader]


def datamodule(tiny_listops, tmp_path, *overrides: str):
    cfg = compose_config(["task=listops_small", f"task.data_dir={tiny_listops}", f"paths.cache_dir={tmp_path}",
                          "task.batch_size=16", *overrides])
    module = instantiate(cfg.task.datamodule)
    module.setup()
    return module


def test_only_the_train_loader_is_augmented_and_workers_change_nothing(tiny_listops, tmp_path):
    plain = datamodule(tiny_listops, tmp_path)
    shuffled = datamodule(tiny_listops, tmp_path, "task.augment=shuffle", "task.group_by_length=true")
    for loaders in (lambda m: [m.val_dataloader()], lambda m: m.test_dataloader()):
        for before, after in zip(loaders(plain), loaders(shuffled)):
            assert all(torch.equal(a[key], b[key]) for a, b in zip(batches(before), batches(after)) for key in a)
    train = shuffled.train_dataloader()
    epochs = [batches(train), batches(train)]
    split = plain.splits["train"]
    changed = 0
    for epoch in epochs:
        for batch in epoch:
            for ids, mask, label in zip(batch["input_ids"], batch["mask"], batch["label"]):
                tokens = ids[mask].tolist()
                matches = [i for i in range(len(split)) if int(split.labels[i]) == int(label)
                           and Counter(split.ids[i, : split.lengths[i]].tolist()) == Counter(tokens)]
                assert matches, "a train example that is no permutation of a training example"
                changed += all(split.ids[i, : split.lengths[i]].tolist() != tokens for i in matches)
    assert changed > len(split)  # shuffled: most examples differ from the file's order, both epochs
    with_workers = datamodule(tiny_listops, tmp_path, "task.augment=shuffle", "task.group_by_length=true",
                              "task.datamodule.num_workers=2").train_dataloader()
    assert all(torch.equal(a[key], b[key]) for epoch in epochs for a, b in zip(epoch, batches(with_workers)) for key in a)


def test_an_unknown_augmentation_names_the_choices(tiny_listops, tmp_path):
    with pytest.raises(Exception, match=r"task.augment='colapse' is not a ListOps augmentation: expected null or one of collapse, shuffle"):
        datamodule(tiny_listops, tmp_path, "task.augment=colapse")


def test_a_run_recorded_before_the_augmentation_keys_still_matches_its_command():
    """lra.runtime.results.ADDED_LATER(_DERIVED): a record that lacks task.augment, its choices, group_by_length and
    listops_small's default_dir resumes (run_dir) and counts as done (config_differences); another augment does not."""
    from omegaconf import OmegaConf

    from lra.runtime.results import config_differences
    from lra.runtime.run_dir import resolved, settings_differences

    cfg = compose_config(["task=listops_small"])
    for current in (resolved(cfg), OmegaConf.to_container(cfg, resolve=False)):
        old = {**current, "task": {key: value for key, value in current["task"].items()
                                   if key not in ("augment", "augmentations", "group_by_length")}}
        old["task"]["datamodule"] = {key: value for key, value in current["task"]["datamodule"].items()
                                     if key not in ("augment", "augmentations", "group_by_length")}
        old["task"]["datamodule"]["generate"] = {key: value for key, value in current["task"]["datamodule"]["generate"].items()
                                                 if key != "default_dir"}
        assert settings_differences(old, current) == [] and config_differences(old, current) == []
    augmented = resolved(compose_config(["task=listops_small", "task.augment=collapse"]))
    assert ("task.augment", None, "collapse") in settings_differences(old, augmented)
