"""Data tooling: ``scripts/download_lra.sh`` / ``python -m lra.data download`` on local archives (file:// URLs)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from lra import REPO_ROOT
from lra.data import download, unpack


def make_tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": str(REPO_ROOT / ".venv" / "bin" / "python"), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(["bash", str(REPO_ROOT / "scripts" / "download_lra.sh"), *args],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.process
def test_script_fetches_and_unpacks_archives_into_the_documented_layout(tmp_path):
    imdb = make_tar(tmp_path / "imdb.tar.gz", {"aclImdb/train/pos/0_9.txt": b"great", "aclImdb/test/neg/0_1.txt": b"bad"})
    release = make_tar(tmp_path / "lra.gz", {"lra_release/tsv_data/new_aan_pairs.eval.tsv": b"1.0\ta\tb\tx\ty\n"})
    data = tmp_path / "data"
    proc = run_script("imdb", "lra_release", "--data-dir", str(data),
                      "--url", f"imdb={imdb.as_uri()}", "--url", f"lra_release={release.as_uri()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (data / "aclImdb" / "train" / "pos" / "0_9.txt").read_bytes() == b"great"
    assert (data / "lra_release" / "tsv_data" / "new_aan_pairs.eval.tsv").exists()
    assert (data / "downloads" / "aclImdb_v1.tar.gz").exists()
    again = run_script("imdb", "--data-dir", str(data), "--url", "imdb=file:///nonexistent")
    assert again.returncode == 0 and "already there" in again.stdout  # nothing fetched twice


@pytest.mark.process
def test_unknown_names_and_bad_urls_are_rejected(tmp_path):
    proc = run_script("mnist", "--data-dir", str(tmp_path))
    assert proc.returncode != 0 and "unknown dataset mnist" in proc.stderr
    proc = run_script("imdb", "--data-dir", str(tmp_path), "--url", "imdb-http://x")
    assert proc.returncode != 0 and "--url expects NAME=URL" in proc.stderr


def test_unreachable_url_leaves_no_partial_archive(tmp_path):
    with pytest.raises(RuntimeError, match=r"could not fetch file:///nonexistent/x.tar.gz .*--url NAME=<mirror URL>"):
        download("cifar10", tmp_path, "file:///nonexistent/x.tar.gz")
    assert not any((tmp_path / "downloads").iterdir())


def test_a_corrupt_or_wrong_archive_is_named(tmp_path):
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(RuntimeError, match=rf"{broken} is not a readable tar archive"):
        unpack(broken, tmp_path / "data", "aclImdb")
    wrong = make_tar(tmp_path / "wrong.tar.gz", {"other/file.txt": b"x"})
    with pytest.raises(RuntimeError, match="did not unpack to .*aclImdb"):
        unpack(wrong, tmp_path / "data", "aclImdb")


@pytest.mark.process
def test_an_unpack_killed_part_way_is_redone_not_taken_as_done(tmp_path):
    files = {f"aclImdb/train/pos/{i}_7.txt": b"x" * 200 for i in range(4000)}
    archive = make_tar(tmp_path / "imdb.tar.gz", files)
    data = tmp_path / "data"
    folder = data / "aclImdb"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(REPO_ROOT / ".venv" / "bin" / "python"), "-m", "lra.data", "download", "imdb",
                             "--data-dir", str(data), "--url", f"imdb={archive.as_uri()}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    pos = folder / "train" / "pos"
    while proc.poll() is None and not (pos.is_dir() and any(pos.iterdir())):
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)  # mid-unpack (the archive was fetched whole first)
    proc.wait()
    if (folder / ".unpacked").exists():
        pytest.skip("the unpack finished before the kill landed (machine too fast for 4000 files)")
    assert len(list(pos.iterdir())) < len(files)
    again = run_script("imdb", "--data-dir", str(data), "--url", "imdb=file:///nonexistent")  # the archive is kept
    assert again.returncode == 0, again.stderr[-3000:]
    assert "unpack did not finish" in again.stdout and "already there" not in again.stdout
    assert len(list(pos.iterdir())) == len(files) and (folder / ".unpacked").is_file()
    assert "already there" in run_script("imdb", "--data-dir", str(data)).stdout


def test_a_folder_without_marker_or_archive_says_how_to_go_on(tmp_path):
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"partial")
    with pytest.raises(RuntimeError, match=r"no \.unpacked marker.*delete .*cifar-10-batches-py.*touch"):
        download("cifar10", tmp_path, "file:///nonexistent/x.tar.gz")
