"""Resume is reproducible: the train order is derived from (seed, epoch), its position is stored in the checkpoint.

The end-to-end check SIGKILLs a real training run mid-epoch (``tests.faults.Faults`` with
``LRA_FAULT_SIGKILL_AT``: no cleanup, no exception checkpoint), resumes it from ``last.ckpt``
in the same run dir, and compares test_acc and the final weights with an uninterrupted run.
"""

from __future__ import annotations

import json
import re
import signal

import pytest
import torch

from lra.tasks.base import SplitDataset, TokenizedSplit, collate
from lra.tasks.resume import EpochSampler, ResumableLoader
from tests.conftest import run_cli


def dataset(n: int = 10) -> SplitDataset:
    return SplitDataset(TokenizedSplit(torch.arange(n).view(n, 1).short(), torch.ones(n, dtype=torch.int32), torch.zeros(n, dtype=torch.long)))


def loader(seed: int = 0, n: int = 10, batch_size: int = 3) -> ResumableLoader:
    data = dataset(n)
    return ResumableLoader(data, batch_size=batch_size, sampler=EpochSampler(data, seed), collate_fn=collate)


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


def test_state_restores_the_position_mid_epoch_and_at_the_epoch_end():
    uninterrupted = sum(epochs(loader(), 4), [])  # 16 batches
    for taken in (1, 5, 7, 8):  # 8 = exactly the end of the second epoch
        interrupted = loader()
        seen, iterator = [], iter(interrupted)
        while len(seen) < taken:
            batch = next(iterator, None)
            if batch is None:
                iterator = iter(interrupted)  # next epoch
                continue
            seen += ids([batch])
        state = interrupted.state_dict()
        resumed = loader()  # as in a fresh process: same settings, nothing else
        resumed.load_state_dict(state)
        rest = sum(epochs(resumed, 4), [])  # the rest of the interrupted epoch, then whole ones
        assert (seen + rest)[: len(uninterrupted)] == uninterrupted, taken


def test_resuming_with_other_loader_settings_names_them():
    state = loader(batch_size=3).state_dict()
    with pytest.raises(ValueError, match=r"batch_size 3 -> 4.*task.batch_size.*hydra.run.dir"):
        loader(batch_size=4).load_state_dict(state)


# three short training runs: 18 s on a 2-core machine
def test_killed_and_resumed_run_equals_the_uninterrupted_run(tiny_listops_overrides, tmp_path):
    # 64 train examples / batch 16 = 4 batches per epoch; last.ckpt every 3 steps. Killed at step 5 (in epoch 1),
    # the run resumes from step 3 (3 of epoch 0's 4 batches done; steps 4-5 are redone) and crosses two epoch ends.
    overrides = [*tiny_listops_overrides, "trainer.max_steps=10", "task.eval_every=3", "seed=5",
                 "+callbacks.faults._target_=tests.faults.Faults"]

    def train(run_dir, env=None):
        return run_cli(["-m", "lra.train", *overrides, f"hydra.run.dir={run_dir}"], timeout=1800, env=env)

    whole = train(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = train(tmp_path / "resumed", env={"LRA_FAULT_SIGKILL_AT": "5"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    checkpoint = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 3
    resumed = train(tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and "not resumable" not in resumed.stderr
    # The progress bar of the restarted epoch names it and starts at its 4th batch (lra.callbacks.ResumingProgressBar)
    assert "Epoch 0:  75%|" in resumed.stdout and "3/4 [" in resumed.stdout
    assert re.search(r"-[0-9.]+it/s", resumed.stdout) is None  # no negative rate where epoch 1 resets the bar

    results = {name: json.loads((tmp_path / name / "results.json").read_text()) for name in ("whole", "resumed")}
    assert results["resumed"]["resumed_from_step"] == 3 and results["resumed"]["steps"] == results["whole"]["steps"] == 10
    assert results["resumed"]["test_acc"] == results["whole"]["test_acc"]
    assert results["resumed"]["val_acc_best"] == results["whole"]["val_acc_best"]
    weights = {name: torch.load(tmp_path / name / "checkpoints" / "last.ckpt", map_location="cpu",
                                weights_only=False)["state_dict"] for name in ("whole", "resumed")}
    assert weights["whole"].keys() == weights["resumed"].keys()
    assert all(torch.equal(weights["whole"][key], weights["resumed"][key]) for key in weights["whole"])
