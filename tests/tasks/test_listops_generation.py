"""Data generation never overwrites a user's files: ListOps generates only into an empty or absent folder, or over
the files an earlier generation with the same settings wrote (``generated.json``); anything else is refused, named."""

from __future__ import annotations

import json
import os

import pytest
from hydra.utils import instantiate

from lra.tasks import listops_generator
from lra.tasks.generated import MANIFEST, GenerationRefused
from tests.conftest import compose_config

SMALL = dict(seed=0, min_length=10, max_length=60)
SIZES = {"train": 20, "val": 5, "test": 5}


def datamodule(tmp_path, data_dir=None):
    """``task=listops_small`` with 20/5/5 examples; its own folder under ``tmp_path/data``, or ``data_dir``."""
    overrides = ["task=listops_small", f"paths.data_dir={tmp_path / 'data'}", f"paths.cache_dir={tmp_path / 'cache'}",
                 *(f"task.datamodule.generate.sizes.{split}={count}" for split, count in SIZES.items()),
                 "task.datamodule.generate.max_length=60"]
    if data_dir is not None:
        overrides.append(f"task.data_dir={data_dir}")
    return instantiate(compose_config(overrides).task.datamodule)


def users_files(folder):
    folder.mkdir(parents=True)
    (folder / "basic_train.tsv").write_text(listops_generator.HEADER + "\n( ( ( [MAX 2 ) 9 ) ] )\t9\n")
    (folder / "basic_val.tsv").write_text(listops_generator.HEADER + "\n( ( ( [MIN 2 ) 9 ) ] )\t2\n")
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_a_users_incomplete_folder_is_refused_naming_the_file_and_nothing_is_written(tmp_path, capsys):
    mine = tmp_path / "mine"
    before = users_files(mine)
    with pytest.raises(FileExistsError) as refused:
        datamodule(tmp_path, mine).setup()
    message = str(refused.value)
    assert f"task.data_dir={mine}" in message and "basic_test.tsv missing" in message
    assert "overwrite basic_train.tsv" in message and "no readable generated.json" in message
    assert f"python -m lra.tasks.listops generate --out {mine}-generated --train 20 --val 5 --test 5" in message
    assert {path.name: path.read_bytes() for path in mine.iterdir()} == before  # no test file, no manifest, same bytes
    assert "note:" not in capsys.readouterr().out  # the folder exists with files: no "generating there" note


def test_the_command_line_refuses_too(tmp_path, capsys):
    mine = tmp_path / "mine"
    before = users_files(mine)
    with pytest.raises(SystemExit) as exit_:
        listops_generator.main(["generate", "--out", str(mine), "--train", "5", "--val", "5", "--test", "5", "--independent-test", "0"])
    assert exit_.value.code == 1
    error = capsys.readouterr().err
    assert f"refusing to generate into {mine}: it holds basic_train.tsv" in error and f"--out {mine}-generated" in error
    assert {path.name: path.read_bytes() for path in mine.iterdir()} == before


def test_generates_into_an_empty_folder_and_records_what_it_wrote(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    listops_generator.generate(out, SIZES, **SMALL)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["settings"]["sizes"] == [["train", 20], ["val", 5], ["test", 5]] and manifest["settings"]["seed"] == 0
    assert sorted(manifest["files"]) == sorted(path.name for path in out.iterdir() if path.name != MANIFEST)
    assert len((out / "basic_train.tsv").read_text().splitlines()) == 21


def test_a_folder_the_same_settings_generated_is_taken_over(tmp_path):
    """A generation killed after two files (here: the third deleted) is completed; the files it has keep their bytes
    and mtime (so their caches stay valid), the missing one is the same file an uninterrupted generation writes."""
    module = datamodule(tmp_path)
    module.setup()
    folder = module.data_dir
    whole = {path.name: path.read_bytes() for path in folder.iterdir()}
    train_mtime = (folder / "basic_train.tsv").stat().st_mtime_ns
    (folder / "basic_test.tsv").unlink()
    datamodule(tmp_path).setup()
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == whole
    assert (folder / "basic_train.tsv").stat().st_mtime_ns == train_mtime


@pytest.mark.parametrize("change", ["edited", "other settings", "unlisted"])
def test_a_generated_folder_that_changed_is_refused(tmp_path, change):
    out = tmp_path / "set"
    listops_generator.generate(out, SIZES, **SMALL)
    (out / "basic_test.tsv").unlink()
    if change == "edited":
        path = out / "basic_train.tsv"
        path.write_text(path.read_text().replace("\t", "\t1", 1))
        expected = "basic_train.tsv, changed since it was generated"
    elif change == "other settings":
        expected = "from a generation with other settings"
    else:
        (out / "notes.txt").write_text("mine")
        expected = "notes.txt, which generated.json does not list"
    seed = 1 if change == "other settings" else SMALL["seed"]
    with pytest.raises(GenerationRefused, match=expected):
        listops_generator.generate(out, SIZES, **{**SMALL, "seed": seed})
    assert not (out / "basic_test.tsv").exists()


def test_a_user_given_absent_folder_is_generated_with_a_one_line_note(tmp_path, capsys):
    typo = tmp_path / "dta" / "listops"
    module = datamodule(tmp_path, typo)
    module.setup()
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[lra] note:")]
    assert notes == [f"[lra] note: task.data_dir={typo} does not exist: generating a synthetic ListOps set there "
                     "(train 20, val 5, test 5; seed 0)"]
    assert len(module.splits["train"]) == 20 and (typo / MANIFEST).is_file()


def test_the_tasks_own_folder_is_generated_without_a_note(tmp_path, capsys):
    module = datamodule(tmp_path)
    assert not module.data_dir.exists()
    module.setup()
    assert module.data_dir == tmp_path / "data" / "listops_small" and len(module.splits["val"]) == 5
    assert "[lra] note:" not in capsys.readouterr().out


def test_a_temporary_file_left_by_a_killed_write_is_not_a_users_file(tmp_path):
    out = tmp_path / "set"
    listops_generator.generate(out, SIZES, **SMALL)
    (out / "basic_test.tsv").unlink()
    (out / ".basic_test.tsv.abc123.tmp").write_text("half a file")
    listops_generator.generate(out, SIZES, **SMALL)
    assert (out / "basic_test.tsv").is_file() and os.path.getsize(out / "basic_test.tsv") > 0


def test_generation_leaves_no_lock_file_beside_the_data_dir(tmp_path):
    """The lock that lets one of several processes generate is removed once the files are there (and on a refusal)."""
    mine = tmp_path / "mine"
    datamodule(tmp_path, mine).prepare_data()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cache", "mine"]
    users_files(tmp_path / "users")
    with pytest.raises(FileExistsError):
        datamodule(tmp_path, tmp_path / "users").prepare_data()
    assert not list(tmp_path.glob(".*.lock"))
