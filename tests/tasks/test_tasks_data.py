"""Data tooling: ``scripts/download_lra.sh`` / ``python -m lra.data download`` on local archives (file:// URLs).

The fake archives are not the published ones, so a source with a published checksum (imdb, cifar10) refuses them;
tests of what happens after the check set that source's expected size and checksum to the fake's (``published``)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from lra import REPO_ROOT
from lra import data as lra_data
from lra.data import MARKER, download, unpack


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


def published(monkeypatch, name: str, archive: Path) -> None:
    """Source ``name``'s published size and checksum set to ``archive``'s (the fake stands for the real one)."""
    checksum = "sha256:" + hashlib.sha256(archive.read_bytes()).hexdigest()
    source = dataclasses.replace(lra_data.SOURCES[name], size=archive.stat().st_size, checksum=checksum)
    monkeypatch.setitem(lra_data.SOURCES, name, source)


@pytest.mark.process
def test_script_unpacks_the_release_and_refuses_an_archive_that_is_not_the_published_one(tmp_path):
    imdb = make_tar(tmp_path / "imdb.tar.gz", {"aclImdb/train/pos/0_9.txt": b"great", "aclImdb/test/neg/0_1.txt": b"bad"})
    release = make_tar(tmp_path / "lra.gz", {"lra_release/tsv_data/new_aan_pairs.eval.tsv": b"1.0\ta\tb\tx\ty\n"})
    data = tmp_path / "data"
    proc = run_script("lra_release", "imdb", "--data-dir", str(data),
                      "--url", f"imdb={imdb.as_uri()}", "--url", f"lra_release={release.as_uri()}")
    assert (data / "lra_release" / "tsv_data" / "new_aan_pairs.eval.tsv").exists()  # no published checksum: noted
    sha256 = hashlib.sha256(release.read_bytes()).hexdigest()
    assert f"no checksum is published for lra_release.gz; its SHA-256 is {sha256}" in proc.stdout
    assert (data / "lra_release" / MARKER).read_text().endswith(f"sha256:{sha256}\n")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (  # the fake imdb: 116 bytes, not 84125825
        f"[lra] FAILED: imdb: {data / 'downloads' / 'aclImdb_v1.tar.gz.part'} is not the published aclImdb_v1.tar.gz: "
        f"{imdb.stat().st_size} bytes, the published archive has 84125825. Nothing was unpacked or deleted. The download "
        f"is kept as {data / 'downloads' / 'aclImdb_v1.tar.gz.part'} to inspect: fetch it again (it may have been cut "
        f"short) or from another mirror (--url imdb=<URL>)")
    assert not (data / "aclImdb").exists() and not (data / "downloads" / "aclImdb_v1.tar.gz").exists()
    again = run_script("lra_release", "--data-dir", str(data), "--url", "lra_release=file:///nonexistent")
    assert again.returncode == 0 and "already there" in again.stdout  # nothing fetched twice


def test_a_mirror_with_the_published_archive_unpacks_into_the_documented_layout(tmp_path, monkeypatch):
    imdb = make_tar(tmp_path / "imdb.tar.gz", {"aclImdb/train/pos/0_9.txt": b"great", "aclImdb/test/neg/0_1.txt": b"bad"})
    published(monkeypatch, "imdb", imdb)
    data = tmp_path / "data"
    download("imdb", data, imdb.as_uri())
    assert (data / "aclImdb" / "train" / "pos" / "0_9.txt").read_bytes() == b"great"
    assert (data / "downloads" / "aclImdb_v1.tar.gz").read_bytes() == imdb.read_bytes()
    assert (data / "aclImdb" / MARKER).read_text().endswith(lra_data.SOURCES["imdb"].checksum + "\n")


def test_an_archive_put_there_by_hand_is_checked_and_kept_when_it_does_not_match(tmp_path, monkeypatch):
    real = make_tar(tmp_path / "real.tar.gz", {"cifar-10-batches-py/test_batch": b"x"})
    published(monkeypatch, "cifar10", real)
    forged = bytearray(real.read_bytes())
    forged[len(forged) // 2] ^= 1  # one bit: the size passes, the checksum refuses it
    archive = tmp_path / "data" / "downloads" / "cifar-10-python.tar.gz"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(forged)
    with pytest.raises(RuntimeError, match=rf"cifar10: {archive} is not the published cifar-10-python.tar.gz: its "
                                           rf"SHA256 is [0-9a-f]{{64}}, the published one [0-9a-f]{{64}}\. Nothing was "
                                           rf"unpacked or deleted\. Delete or move it and run the command again"):
        download("cifar10", tmp_path / "data", "file:///nonexistent")
    assert archive.read_bytes() == forged and not (tmp_path / "data" / "cifar-10-batches-py").exists()
    archive.write_bytes(real.read_bytes())  # the right one by hand: unpacked
    download("cifar10", tmp_path / "data", "file:///nonexistent")
    assert (tmp_path / "data" / "cifar-10-batches-py" / "test_batch").read_bytes() == b"x"


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
    files = {f"lra_release/tsv_data/{i}.tsv": b"x" * 200 for i in range(4000)}  # no published checksum to match
    archive = make_tar(tmp_path / "lra.gz", files)
    data = tmp_path / "data"
    folder = data / "lra_release"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(REPO_ROOT / ".venv" / "bin" / "python"), "-m", "lra.data", "download", "lra_release",
                             "--data-dir", str(data), "--url", f"lra_release={archive.as_uri()}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    pos = folder / "tsv_data"
    while proc.poll() is None and not (pos.is_dir() and any(pos.iterdir())):
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)  # mid-unpack (the archive was fetched whole first)
    proc.wait()
    if (folder / ".unpacked").exists():
        pytest.skip("the unpack finished before the kill landed (machine too fast for 4000 files)")
    assert len(list(pos.iterdir())) < len(files)
    again = run_script("lra_release", "--data-dir", str(data), "--url", "lra_release=file:///nonexistent")  # the archive is kept
    assert again.returncode == 0, again.stderr[-3000:]
    assert "unpack did not finish" in again.stdout and "already there" not in again.stdout
    assert len(list(pos.iterdir())) == len(files) and (folder / ".unpacked").is_file()
    assert "already there" in run_script("lra_release", "--data-dir", str(data)).stdout


def test_a_folder_without_marker_or_archive_says_how_to_go_on(tmp_path):
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"partial")
    with pytest.raises(RuntimeError, match=r"no \.unpacked marker.*delete .*cifar-10-batches-py.*touch"):
        download("cifar10", tmp_path, "file:///nonexistent/x.tar.gz")
