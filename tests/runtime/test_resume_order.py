"""Resume is reproducible: the train order is derived from (seed, epoch), its position is stored in the checkpoint.

The end-to-end check stops a real training run mid-epoch (``tests.faults.Faults``): SIGKILL (no cleanup, no
exception checkpoint), Ctrl-C (SIGINT) between validations or during one, Ctrl-C twice (stopped at once); it
resumes the run from its newest checkpoint in the same run dir and compares test_acc, the validation curve, the
final weights and ``metrics.csv`` with an uninterrupted run.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest
import torch

from lra.tasks.base import SplitDataset, collate
from lra.tasks.resume import EpochSampler, ResumableLoader, group_by_length
from lra.tasks.splits import TokenizedSplit
from tests.conftest import run_cli, run_in_process
from tests.console_output import bar_states


def dataset(n: int = 10) -> SplitDataset:
    return SplitDataset(TokenizedSplit(torch.arange(n).view(n, 1).short(), torch.ones(n, dtype=torch.int32), torch.zeros(n, dtype=torch.long)))


def example_lengths(n: int) -> torch.Tensor:
    """Lengths 1..50 that differ from example to example, in no particular order."""
    return (torch.arange(n) * 37 % 50 + 1).int()


def loader(seed: int = 0, n: int = 10, batch_size: int = 3, grouped: bool = False, replicas: int = 1,
           rank: int = 0) -> ResumableLoader:
    data = dataset(n)
    lengths = example_lengths(n) if grouped else None
    sampler = EpochSampler(data, seed, replicas, rank, lengths=lengths, batch_size=batch_size)
    return ResumableLoader(data, batch_size=batch_size, sampler=sampler, collate_fn=collate)


def ids(batches) -> list[list[int]]:
    return [batch["input_ids"][:, 0].tolist() for batch in batches]


def epochs(load: ResumableLoader, count: int) -> list[list[list[int]]]:
    """``count`` whole epochs, one after another, as a training loop takes them."""
    return [ids(load) for _ in range(count)]


def test_order_depends_only_on_seed_and_epoch():
    first, again, other = epochs(loader(seed=1), 3), epochs(loader(seed=1), 3), epochs(loader(seed=2), 3)
    assert first == again and first != other
    assert first[0] != first[1] != first[2]  # reshuffled every epoch
    assert all(sorted(sum(epoch, [])) == list(range(10)) and len(epoch) == 4 for epoch in first)  # 3+3+3+1
    assert first[1] != other[0]  # epochs are not seeded seed + epoch
    lightning_like = loader(seed=1)
    lightning_like.sampler.set_epoch(7)  # Lightning's epoch number is ignored: the loader counts
    assert ids(lightning_like) == first[0]


@pytest.mark.parametrize("grouped", [False, True])
def test_state_restores_the_position_mid_epoch_and_at_the_epoch_end(grouped):
    uninterrupted = sum(epochs(loader(grouped=grouped), 4), [])  # 16 batches
    for taken in (1, 5, 7, 8):  # 8 = exactly the end of the second epoch
        interrupted = loader(grouped=grouped)
        seen, iterator = [], iter(interrupted)
        while len(seen) < taken:
            batch = next(iterator, None)
            if batch is None:
                iterator = iter(interrupted)  # next epoch
                continue
            seen += ids([batch])
        state = interrupted.state_dict()
        resumed = loader(grouped=grouped)  # as in a fresh process: same settings, nothing else
        resumed.load_state_dict(state)
        rest = sum(epochs(resumed, 4), [])  # the rest of the interrupted epoch, then whole ones
        assert (seen + rest)[: len(uninterrupted)] == uninterrupted, taken


def test_resuming_with_other_loader_settings_names_them():
    state = loader(batch_size=3).state_dict()
    with pytest.raises(ValueError, match=r"batch_size 3 -> 4.*task.batch_size.*hydra.run.dir"):
        loader(batch_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match=r"group_by_length False -> True.*task.group_by_length"):
        loader(grouped=True).load_state_dict(state)
    del state["group_by_length"]  # a checkpoint written before the setting existed resumes ungrouped
    loader().load_state_dict(state)


def test_group_by_length_batches_similar_lengths_from_the_shuffled_groups():
    n, batch, per_group = 1000, 8, 5
    lengths, order = example_lengths(n), torch.randperm(n, generator=torch.Generator().manual_seed(3))
    grouped = group_by_length(order, lengths, batch, torch.Generator().manual_seed(4), batches_per_group=per_group)
    assert sorted(grouped.tolist()) == list(range(n))
    chunk = per_group * batch
    for start in range(0, n, chunk):  # a group holds the same examples as the shuffle's slice, regrouped by length
        assert sorted(grouped[start : start + chunk].tolist()) == sorted(order[start : start + chunk].tolist())
        by_length = torch.sort(lengths[order[start : start + chunk]], descending=True).values.view(-1, batch)
        batches = lengths[grouped[start : start + chunk]].view(-1, batch)
        assert sorted(map(tuple, batches.tolist())) == sorted(map(tuple, by_length.tolist()))  # batches are sorted runs
    padded = {name: int(lengths[o].view(-1, batch).amax(1).sum()) * batch for name, o in (("grouped", grouped), ("shuffled", order))}
    assert padded["grouped"] < 0.75 * padded["shuffled"]  # deterministic token count: lengths 1..50, 40 per group
    batch_orders = {tuple(group_by_length(order, lengths, batch, torch.Generator().manual_seed(seed), per_group)[:chunk].tolist())
                    for seed in range(5)}
    assert len(batch_orders) > 1  # the batches of a group come in a random order


def test_group_by_length_keeps_a_short_last_batch_last_and_shares_global_batches_between_ranks():
    n, batch = 23, 3  # 2 ranks: total 24 (one index repeated), global batches of 6
    ranks = [ids(loader(n=n, batch_size=batch, grouped=True, replicas=2, rank=rank)) for rank in (0, 1)]
    assert [len(b) for b in ranks[0]] == [len(b) for b in ranks[1]] == [3, 3, 3, 3]
    lengths = example_lengths(n).tolist()
    everything = sorted((lengths[i] for rank in ranks for b in rank for i in b), reverse=True)
    runs = [everything[k : k + 2 * batch] for k in range(0, len(everything), 2 * batch)]
    for first, second in zip(*ranks):  # each step the two ranks hold halves of one global batch: a sorted run of 6
        assert sorted((lengths[i] for i in first + second), reverse=True) in runs
    single = ids(loader(n=10, batch_size=3, grouped=True))
    assert [len(b) for b in single] == [3, 3, 3, 1] and sorted(sum(single, [])) == list(range(10))


# Training orders: shuffled, grouped by length, and grouped with most examples rewritten (the rewrites of the redone
# steps and of epoch 1 are drawn again from (seed, epoch, index)).
SETTINGS = {"shuffled": ["task.group_by_length=false"], "grouped": ["task.group_by_length=true"],
            "augmented": ["task.group_by_length=true", "task.augment=collapse",
                          "task.augmentations.collapse.intercept=-1.0"]}
# (fault env var, step, training order, exit code, the step it resumes from). 64 train examples / batch 16 = 4
# batches per epoch; last.ckpt every 3 steps. SIGKILL at step 5 (in epoch 1): no exception checkpoint, the run
# resumes from step 3 (3 of epoch 0's 4 batches done; steps 4-5 are redone) and crosses two epoch ends. Ctrl-C
# (SIGINT) at step 5: the step is finished and saved, the run resumes there; during the validation after step 6:
# the validation is finished first; pressed twice: stopped at once, the run resumes from step 3 as after a SIGKILL,
# and so does a run that failed in the middle of step 6 (its state there would resume off by one step).
# The default suite keeps one case per way of stopping, in the shuffled order; the other orders (the grouped order's
# position in an epoch is restored in test_state_restores_the_position_mid_epoch_and_at_the_epoch_end) and the
# fallbacks to an earlier checkpoint run with `make test-slow` (each case trains twice: stopped in a process of its
# own, resumed in the test's).
FAULTS = [
    ("SIGKILL", 5, "shuffled", -signal.SIGKILL, 3),
    pytest.param("SIGKILL", 5, "grouped", -signal.SIGKILL, 3, marks=pytest.mark.slow),
    pytest.param("SIGKILL", 5, "augmented", -signal.SIGKILL, 3, marks=pytest.mark.slow),
    # SIGINT's handler is also SIGINT_IN_VALIDATION's, a shuffled resume also SIGKILL's: slow
    pytest.param("SIGINT", 5, "shuffled", 128 + signal.SIGINT, 5, marks=pytest.mark.slow),
    ("SIGINT_IN_VALIDATION", 6, "shuffled", 128 + signal.SIGINT, 6),
    pytest.param("SIGINT_TWICE", 5, "shuffled", 128 + signal.SIGINT, 3, marks=pytest.mark.slow),
    pytest.param("ERROR", 5, "shuffled", 1, 3, marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def train_run(tiny_listops, tmp_path_factory):
    """``train_run(run_dir, order, env)``: the 10-step training run of these tests in a training order of
    :data:`SETTINGS`, in a process of its own when ``env`` names a fault; the uninterrupted run of each order
    (``run_dir`` None) is trained once for every fault."""
    cache, uninterrupted = tmp_path_factory.mktemp("cache"), {}

    def train(run_dir, order: str, env=None):
        if run_dir is None:
            if order not in uninterrupted:
                uninterrupted[order] = tmp_path_factory.mktemp(f"uninterrupted_{order}")
                done = train(uninterrupted[order], order)
                assert done.returncode == 0, done.stderr[-3000:]
            return uninterrupted[order]
        overrides = ["task=listops_small", f"task.data_dir={tiny_listops}", f"paths.cache_dir={cache}",
                     "task.batch_size=16", "task.warmup_steps=2", "logger=csv", "trainer.max_steps=10",
                     "task.eval_every=3", "seed=5", *SETTINGS[order], "+callbacks.faults._target_=tests.faults.Faults"]
        args = ["-m", "lra.train", *overrides, f"hydra.run.dir={run_dir}"]
        # a fault stops a real process; the uninterrupted and resumed runs run the entry point in this one
        return run_cli(args, timeout=1800, env=env) if env else run_in_process(args)

    return train


def outcome(run_dir) -> dict:
    """What a run leaves: its record, its final weights and its metrics.csv."""
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return {"results": json.loads((run_dir / "results.json").read_text()), "weights": last["state_dict"],
            "metrics": (run_dir / "csv" / "version_0" / "metrics.csv").read_text()}


@pytest.mark.process
@pytest.mark.parametrize("fault, step, order, returncode, resumed_from", FAULTS)
def test_stopped_and_resumed_run_equals_the_uninterrupted_run(train_run, tmp_path, fault, step, order, returncode,
                                                              resumed_from):
    run_dir = tmp_path / "resumed"
    stopped = train_run(run_dir, order, env={f"LRA_FAULT_{fault}_AT": str(step)})
    assert stopped.returncode == returncode, stopped.stderr[-3000:]
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == resumed_from
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    if fault.startswith("SIGINT"):  # Ctrl-C: recorded and explained like SIGTERM, not Lightning's KeyboardInterrupt
        record = json.loads((run_dir / "results.json").read_text())
        assert record["status"] == "interrupted" and record["steps"] == step
        cause = "a second SIGINT (Ctrl-C), at once" if fault == "SIGINT_TWICE" else "SIGINT (Ctrl-C) at"
        assert f"[lra] INTERRUPTED by {cause}" in stopped.stdout
        hint = f"re-run the same command with hydra.run.dir={run_dir} to resume from {run_dir / 'checkpoints'}"
        assert hint in stopped.stdout
        # The step's own checkpoint; after a validation last.ckpt is that step's already; a second Ctrl-C saves nothing
        interrupted = [path.name for path in (run_dir / "checkpoints").glob("interrupted-*.ckpt")]
        assert interrupted == ([f"interrupted-{step}.ckpt"] if fault == "SIGINT" else [])
        assert "KeyboardInterrupt" not in stopped.stdout + stopped.stderr
    resumed = train_run(run_dir, order)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {run_dir / 'checkpoints'}" in resumed.stdout and f"(step {resumed_from})" in resumed.stdout
    assert "not resumable" not in resumed.stderr
    # The bar counts the run's steps from the restored one, across epochs (lra.runtime.progress.StepProgressBar)
    states = bar_states(resumed.stdout, "train")
    assert states[0] == (resumed_from, 10) and states[-1] == (10, 10) and all(total == 10 for _, total in states)
    assert re.search(r"-[0-9.]+step/s", resumed.stdout) is None

    whole, again = outcome(train_run(None, order)), outcome(run_dir)
    assert again["results"]["resumed_from_step"] == resumed_from
    assert again["results"]["steps"] == whole["results"]["steps"] == 10
    for key in ("test_acc", "val_acc_best", "val_curve"):
        assert again["results"][key] == whole["results"][key], key
    assert [point[0] for point in again["results"]["val_curve"]] == [3, 6, 9, 10]
    assert again["metrics"] == whole["metrics"]
    assert whole["weights"].keys() == again["weights"].keys()
    assert all(torch.equal(whole["weights"][key], again["weights"][key]) for key in whole["weights"])


@pytest.mark.process
# mv: slow, the same resume as cp -r's (which also leaves the original in place)
@pytest.mark.parametrize("how", [pytest.param("mv", marks=pytest.mark.slow), "cp -r"])
def test_a_moved_run_dir_resumes_its_own_checkpoints(train_run, tmp_path, how):
    """Ctrl-C after step 7 (past the validation of step 6), move the run dir (``mv``) or copy it without its file
    times (``cp -r``), resume into the new one: the best score and checkpoint carry over (Lightning stores them as
    absolute paths of the old dir) and the resume starts from the highest step, so the run tests the same checkpoint
    as an uninterrupted one, keeps one best checkpoint, and gives the same results, log and predictions."""
    before, after = tmp_path / "before", tmp_path / "elsewhere" / "after"
    stopped = train_run(before, "shuffled", env={"LRA_FAULT_SIGINT_AT": "7"})
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr[-3000:]
    after.parent.mkdir()
    if how == "mv":
        before.rename(after)
    else:
        subprocess.run(["cp", "-r", str(before), str(after)], check=True)
    cut_short = after / "checkpoints" / ".best-10.ckpt.k3x9q1.tmp"  # what a SIGKILL during a save leaves
    cut_short.write_bytes(b"")
    resumed = train_run(after, "shuffled")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not cut_short.exists() and "removed 1 temporary file(s) of a write cut short" in resumed.stdout
    assert f"resuming from {after / 'checkpoints'}" in resumed.stdout and "(step 7)" in resumed.stdout

    whole_dir = train_run(None, "shuffled")
    whole, again = outcome(whole_dir), outcome(after)
    for key in ("test_acc", "val_acc_best", "val_curve", "steps"):
        assert again["results"][key] == whole["results"][key], key
    assert again["metrics"] == whole["metrics"]
    assert (after / "predictions.json").read_text() == (whole_dir / "predictions.json").read_text()
    best = sorted(path.name for path in (whole_dir / "checkpoints").glob("best-*.ckpt"))
    assert sorted(path.name for path in (after / "checkpoints").glob("best-*.ckpt")) == best
    assert again["results"]["best_checkpoint"] == str(after / "checkpoints" / best[0])
    output = resumed.stdout + resumed.stderr
    assert "dirpath has changed" not in output and "exists and is not empty" not in output


@pytest.mark.process
def test_a_stop_during_the_final_test_resumes_to_the_uninterrupted_record(train_run, tmp_path):
    """Ctrl-C during the final test (which has loaded the best checkpoint): the interrupted record keeps all of fit's
    validation curve, last.ckpt stays fit's last state (not the best checkpoint's, which the test loaded), and the
    resumed run's metrics.csv (its test row's epoch and step), results and predictions equal a run never stopped."""
    run_dir = tmp_path / "stopped in test"  # a space: the printed command quotes it
    stopped = train_run(run_dir, "shuffled", env={"LRA_FAULT_SIGINT_IN_TEST_AT": "0"})
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr[-3000:]
    # the whole command, for a shell: `make train` passes no overrides on, so "the same command" would not resume
    assert f"the command: python -m lra.train task=listops_small task.data_dir=" in stopped.stdout
    assert stopped.stdout.rstrip().endswith(f"+callbacks.faults._target_=tests.faults.Faults 'hydra.run.dir={run_dir}'")
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "interrupted" and record["steps"] == 10
    assert [point[0] for point in record["val_curve"]] == [3, 6, 9, 10]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"] == 10
    resumed = train_run(run_dir, "shuffled")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole_dir = train_run(None, "shuffled")
    whole, again = outcome(whole_dir), outcome(run_dir)
    for key in ("test_acc", "val_acc_best", "val_curve", "steps"):
        assert again["results"][key] == whole["results"][key], key
    assert again["metrics"] == whole["metrics"]
    assert (run_dir / "predictions.json").read_text() == (whole_dir / "predictions.json").read_text()
