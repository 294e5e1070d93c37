"""The split cache: parallel builders, content changes of the same size, empty splits, failed builds."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from lra import REPO_ROOT
from lra.tasks import listops, listops_generator
from lra.tasks.splits import SPLITS
from lra.tasks.files import building

PROCESSES = 4
SIZES = {"train": 48, "val": 16, "test": 16}

# One sweep job's data step: generate the data when missing, build the caches, print a digest of the splits.
BUILD = """
import hashlib, sys, time
from pathlib import Path
from lra.tasks.listops import ListOpsDataModule
ready, go, data_dir, cache_dir = map(Path, sys.argv[1:5])
ready.touch()
while not go.exists():
    time.sleep(0.005)
module = ListOpsDataModule(data_dir=str(data_dir), max_length=60, batch_size=4, cache_dir=str(cache_dir),
                           generate={"sizes": %r, "seed": 0, "min_length": 10, "max_length": 60})
module.prepare_data()
module.setup()
print(hashlib.sha256(b"".join(module.splits[s].ids.numpy().tobytes() for s in ("train", "val", "test"))).hexdigest())
""" % (SIZES,)


@pytest.mark.process
def test_parallel_processes_generate_and_cache_the_same_data_without_failing(tmp_path):
    data_dir, cache_dir, go = tmp_path / "listops", tmp_path / "cache", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", BUILD, str(tmp_path / f"ready{i}"), str(go), str(data_dir), str(cache_dir)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for i in range(PROCESSES)
    ]
    deadline = time.monotonic() + 600  # generous: imports take minutes on a loaded 2-core machine
    while not all((tmp_path / f"ready{i}").exists() for i in range(PROCESSES)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # all imported: start together
    outputs = [proc.communicate(timeout=900) for proc in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
    digests = {out.strip().splitlines()[-1] for out, _ in outputs}  # after the "generating there" notes
    assert len(digests) == 1 and "" not in digests  # every process got the same, whole data
    (folder,) = cache_dir.iterdir()
    assert sorted(path.name for path in folder.glob("*.pt")) == sorted(f"{split}.pt" for split in SPLITS)
    assert not list(folder.glob("*.tmp")) and not list(data_dir.glob("*.tmp"))  # no temporary file left behind


def module(data_dir, cache_dir) -> listops.ListOpsDataModule:
    return listops.ListOpsDataModule(data_dir=str(data_dir), max_length=60, batch_size=4, cache_dir=str(cache_dir))


def test_a_file_edited_in_place_to_the_same_size_rebuilds_the_cache(tmp_path):
    listops_generator.generate(tmp_path / "data", SIZES, seed=0, min_length=10, max_length=60)
    before = module(tmp_path / "data", tmp_path / "cache")
    before.setup()
    old_cache = before.cache_path("test")
    path = tmp_path / "data" / "basic_test.tsv"
    lines = path.read_text().splitlines()
    lines[1], lines[2] = lines[2], lines[1]  # two examples swapped: same size, other content (a label edited alone
    time.sleep(0.01)  # past the file system's timestamp tick                      is no longer its tree's value)
    path.write_text("\n".join(lines) + "\n")
    after = module(tmp_path / "data", tmp_path / "cache")
    after.setup()
    assert after.cache_path("test") != old_cache
    assert after.splits["test"].ids[0].equal(before.splits["test"].ids[1])
    assert after.splits["test"].labels[0] == before.splits["test"].labels[1]
    assert after.splits["train"].ids.equal(before.splits["train"].ids)


@pytest.mark.parametrize("split", ["val", "test"])
def test_an_empty_split_is_an_error_naming_the_file_and_the_fix(tmp_path, split):
    listops_generator.generate(tmp_path / "data", SIZES, seed=0, min_length=10, max_length=60)
    (tmp_path / "data" / f"basic_{split}.tsv").write_text(listops_generator.HEADER + "\n")  # header, no rows
    with pytest.raises(ValueError, match=rf"the {split} split is empty .*basic_{split}\.tsv.*re-download or regenerate"):
        module(tmp_path / "data", tmp_path / "cache").setup()


def add_bad_line(path) -> None:
    path.write_text(path.read_text() + "( MAX 1 2\tnot a label\n")


def test_a_failed_first_build_leaves_no_lock_only_cache_folder(tmp_path):
    listops_generator.generate(tmp_path / "data", SIZES, seed=0, min_length=10, max_length=60)
    add_bad_line(tmp_path / "data" / "basic_train.tsv")
    with pytest.raises(ValueError, match="basic_train.tsv"):
        module(tmp_path / "data", tmp_path / "cache").prepare_data()
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_failed_build_keeps_the_splits_built_before_it(tmp_path):
    listops_generator.generate(tmp_path / "data", SIZES, seed=0, min_length=10, max_length=60)
    add_bad_line(tmp_path / "data" / "basic_val.tsv")
    with pytest.raises(ValueError, match="basic_val.tsv"):
        module(tmp_path / "data", tmp_path / "cache").prepare_data()
    (folder,) = (tmp_path / "cache").iterdir()
    assert sorted(path.name for path in folder.iterdir()) == ["train.pt", "train.pt.lock"]


def test_a_failed_build_leaves_a_folder_it_did_not_create(tmp_path):
    listops_generator.generate(tmp_path / "data", SIZES, seed=0, min_length=10, max_length=60)
    add_bad_line(tmp_path / "data" / "basic_train.tsv")
    data = module(tmp_path / "data", tmp_path / "cache")
    folder = data.cache_path("train").parent
    folder.mkdir(parents=True)
    (folder / "val.pt.lock").touch()  # another process's
    with pytest.raises(ValueError, match="basic_train.tsv"):
        data.prepare_data()
    assert sorted(path.name for path in folder.iterdir()) == ["val.pt.lock"]
    folder.joinpath("val.pt.lock").unlink()
    with pytest.raises(ValueError, match="basic_train.tsv"):
        data.prepare_data()
    assert folder.is_dir() and not any(folder.iterdir())  # empty, but not this build's to remove


@pytest.mark.process
def test_a_process_waiting_on_a_failed_build_takes_it_over(tmp_path):
    """The failing builder removes the folder the waiter waits in; the waiter makes it again and builds."""
    target = tmp_path / "cache" / "listops-0" / "train.pt"
    holding, fail = threading.Event(), threading.Event()
    outcome = {}

    def failing_build() -> None:
        try:
            with building(target, "a test build"):
                holding.set()
                fail.wait()
                raise ValueError("a bad line")
        except ValueError as error:
            outcome["failed"] = str(error)

    def waiting_build() -> None:
        with building(target, "a test build"):
            target.write_bytes(b"built")
        outcome["built"] = target.read_bytes()

    first = threading.Thread(target=failing_build)
    first.start()
    holding.wait(timeout=60)
    second = threading.Thread(target=waiting_build)
    second.start()
    time.sleep(0.5)  # the second thread is waiting on the lock
    fail.set()
    for thread in (first, second):
        thread.join(timeout=60)
    assert outcome == {"failed": "a bad line", "built": b"built"}
    assert sorted(path.name for path in target.parent.iterdir()) == ["train.pt", "train.pt.lock"]


def test_the_temporary_file_of_a_killed_cache_write_is_removed_by_the_next_build(tiny_listops, tmp_path):
    module = listops.ListOpsDataModule(data_dir=str(tiny_listops), max_length=60, batch_size=4, cache_dir=str(tmp_path))
    target = module.cache_path("train")
    target.parent.mkdir(parents=True)
    left = target.parent / f".{target.name}.q8w2e4.tmp"  # a build SIGKILLed during its atomic write
    left.write_bytes(b"\0" * 100)
    module.setup()
    assert target.is_file() and not left.exists()
    assert not list(target.parent.glob(".*.tmp"))


def test_a_full_disk_while_caching_names_the_file_and_keeps_nothing(tiny_listops, tmp_path, monkeypatch):
    """``torch.save`` into a disk with 1,000 bytes left (tests/faults.py): one OSError naming the cache file and the
    fix, instead of torch's "enforce fail at inline_container.cc"; no cut-short cache is left."""
    from tests.faults import FullDiskFile

    real_save = torch.save

    def save_on_a_full_disk(obj, target):
        with FullDiskFile(target, "wb") as handle:
            real_save(obj, handle)

    monkeypatch.setattr(torch, "save", save_on_a_full_disk)
    data = module(tiny_listops, tmp_path / "cache")
    with pytest.raises(OSError, match=r"disk full while writing the data cache .*/train\.pt \(torch\.save: .*free space "
                                      r"there, or cache on another disk with paths\.cache_dir=<dir>"):
        data.setup()
    assert not [path for path in (tmp_path / "cache").rglob("*") if path.is_file()]
