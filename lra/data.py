"""Download and unpack the LRA data under ``data/``: ``python -m lra.data download [NAME ...]``.

Names (default: all three): ``lra_release`` (the LRA release tarball: ListOps, Retrieval/AAN,
Pathfinder and Path-X), ``imdb`` (``aclImdb`` for Text), ``cifar10`` (``cifar-10-batches-py`` for
Image). Archives are kept in ``data/downloads/`` (a finished archive is not fetched again) and
unpacked into ``data/``; a folder whose unpack finished (it holds the ``.unpacked`` marker) is left
alone, one without it (an unpack killed part-way) is unpacked again. ``--tfds imdb_reviews cifar10``
prepares the TFDS versions instead (needs ``requirements-data.txt``), in the array_record format
our readers use. ``--url NAME=URL`` fetches from a mirror (any URL urllib opens, ``file://`` too).
The layouts are documented in ``data/README.md``.

Every archive is checked before it is unpacked, whether this command fetched it (from the source or a mirror) or
it was put in ``data/downloads/`` by hand: its size and checksum must be the published ones (:data:`SOURCES`,
:func:`verify`). A mismatch deletes nothing, unpacks nothing and says what to do. The LRA release has no published
checksum: its SHA-256 is printed and recorded in the ``.unpacked`` marker, to compare copies.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from lra import REPO_ROOT


@dataclass(frozen=True)
class Source:
    """An archive at ``url`` that unpacks to ``data_dir/<unpacks_to>``; ``size`` (bytes) and ``checksum``
    (``"<hashlib algorithm>:<hex>"``) are the published archive's, None where none is published."""

    url: str
    archive: str
    unpacks_to: str
    about: str
    size: int | None
    checksum: str | None


SOURCES = {
    "lra_release": Source("https://storage.googleapis.com/long-range-arena/lra_release.gz", "lra_release.gz",
                          "lra_release", "LRA release: ListOps, Retrieval (AAN), Pathfinder, Path-X (~7.7 GB)",
                          # No size or checksum is published for lra_release.gz (not in google-research/long-range-arena
                          # nor beside the file), and no dataset catalogue or repository we searched (2026-11-28)
                          # records one: none is pinned here rather than one we could not trace to a source.
                          None, None),
    "imdb": Source("https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz", "aclImdb_v1.tar.gz",
                   "aclImdb", "IMDB reviews for Text (~80 MB)",
                   # tensorflow/datasets, tensorflow_datasets/datasets/imdb_reviews/checksums.tsv (its MD5,
                   # 7c2ac02c03563afcf9b574c7e56c153a, is the one torchtext and paddle check)
                   84125825, "sha256:c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe"),
    "cifar10": Source("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", "cifar-10-python.tar.gz",
                      "cifar-10-batches-py", "CIFAR-10 python batches for Image (~170 MB)",
                      # published beside the file, https://www.cs.toronto.edu/~kriz/cifar.html (MD5 only)
                      170498071, "md5:c58f30108f718f92721af3b95e74349a"),
}
TFDS_NAMES = ("imdb_reviews", "cifar10")
CHUNK = 1 << 20
MARKER = ".unpacked"  # written into the unpacked folder after the last member: its absence means "incomplete"


def fetch(url: str, target: Path) -> Path:
    """Stream ``url`` to ``target.part`` and return it (:func:`download` renames it to ``target`` once verified, so an
    interrupted or unverified download is never taken as done)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(url) as response, partial.open("wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=target.name) as progress:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    progress.update(len(chunk))
    except (urllib.error.URLError, OSError) as error:
        partial.unlink(missing_ok=True)
        raise RuntimeError(
            f"could not fetch {url} ({error}); check the connection, pass --url NAME=<mirror URL>, "
            f"or put the archive at {target} yourself and run the command again"
        ) from error
    return partial


def file_checksum(path: Path, algorithm: str) -> str:
    """The hex digest of ``path`` by ``hashlib`` ``algorithm``, read in :data:`CHUNK` pieces."""
    digest = hashlib.new(algorithm)
    with path.open("rb") as handle, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                         desc=f"checking {path.name}", mininterval=2) as progress:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            progress.update(len(chunk))
    return digest.hexdigest()


def verify(name: str, path: Path, fix: str) -> str:
    """Check ``path`` against source ``name``'s published size and checksum (the size first: it costs nothing); return
    the checksum that was checked, ``"<algorithm>:<hex>"`` (SHA-256 where none is published). A mismatch raises a
    ``RuntimeError`` naming the file, both values and ``fix`` (what to do); the file is left as it is."""
    source = SOURCES[name]
    size = path.stat().st_size
    if source.size is not None and size != source.size:
        raise RuntimeError(f"{name}: {path} is not the published {source.archive}: {size} bytes, the published archive "
                           f"has {source.size}. Nothing was unpacked or deleted. {fix}")
    algorithm, expected = source.checksum.split(":") if source.checksum else ("sha256", None)
    found = file_checksum(path, algorithm)
    if expected is None:
        print(f"{name}: no checksum is published for {source.archive}; its SHA-256 is {found} ({size} bytes), "
              f"recorded in the unpacked folder's {MARKER} to compare copies")
    elif found != expected:
        raise RuntimeError(f"{name}: {path} is not the published {source.archive}: its {algorithm.upper()} is {found}, "
                           f"the published one {expected}. Nothing was unpacked or deleted. {fix}")
    return f"{algorithm}:{found}"


def unpack(archive: Path, data_dir: Path, expected: str, checksum: str = "") -> Path:
    """Extract the tar ``archive`` (any compression) into ``data_dir``; it must create ``data_dir/expected``.

    ``data_dir/expected/.unpacked`` (:data:`MARKER`) is written only once every member is out, so an unpack
    that was killed part-way is recognised by its missing marker and redone (members are overwritten); it records
    the archive's name, size, member count and ``checksum`` (:func:`verify`'s)."""
    (data_dir / expected / MARKER).unlink(missing_ok=True)
    count = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in tqdm(members, desc=f"unpacking {archive.name}", unit="file", mininterval=2):
                tar.extract(member, data_dir, filter="data")
                count += member.isfile()
    except (tarfile.TarError, EOFError, OSError) as error:
        raise RuntimeError(
            f"{archive} is not a readable tar archive ({error}); delete it and run the command again to re-download"
        ) from error
    if not (data_dir / expected).is_dir():
        raise RuntimeError(f"{archive} did not unpack to {data_dir / expected}; is it the right archive?")
    (data_dir / expected / MARKER).write_text(f"{archive.name}\t{archive.stat().st_size}\t{count} files\t{checksum}\n")
    return data_dir / expected


def download(name: str, data_dir: Path, url: str | None = None) -> Path:
    """Fetch (unless already in ``data_dir/downloads``) and unpack source ``name``; return the unpacked folder.

    A folder without the marker of a finished unpack is unpacked again from the archive in ``downloads/``;
    without that archive it is an error that says how to go on (it may be a complete copy made by hand)."""
    source = SOURCES[name]
    folder = data_dir / source.unpacks_to
    archive = data_dir / "downloads" / source.archive
    if (folder / MARKER).is_file():
        print(f"{name}: {folder} is already there (delete it to unpack again)")
        return folder
    if folder.is_dir() and any(folder.iterdir()):
        if not archive.exists():
            raise RuntimeError(
                f"{name}: {folder} has no {MARKER} marker, so its unpack may not have finished, and there is no "
                f"{archive} to unpack it again from: delete {folder} and run the command again to fetch and unpack it, "
                f"or, if you copied a complete folder in yourself, accept it with 'touch {folder / MARKER}'"
            )
        print(f"{name}: {folder} has no {MARKER} marker: its unpack did not finish; unpacking {archive} again")
    if archive.exists():  # fetched before, or put there by hand: checked all the same
        checksum = verify(name, archive, f"Delete or move it and run the command again to fetch {source.url}, or put "
                                         f"the published archive there")
    else:
        print(f"{name}: fetching {source.about}")
        partial = fetch(url or source.url, archive)
        checksum = verify(name, partial, f"The download is kept as {partial} to inspect: fetch it again (it may have "
                                         f"been cut short) or from another mirror (--url {name}=<URL>)")
        partial.replace(archive)
    unpack(archive, data_dir, source.unpacks_to, checksum)
    print(f"{name}: ready in {folder}")
    return folder


def prepare_tfds(name: str, tfds_data_dir: str | None) -> None:
    """Download and prepare TFDS ``name`` in the array_record format (what ``tfds.data_source`` reads)."""
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise RuntimeError("--tfds needs tensorflow-datasets: '.venv/bin/pip install -r requirements-data.txt'") from error
    tfds.builder(name, data_dir=tfds_data_dir, file_format="array_record").download_and_prepare()
    print(f"{name}: TFDS dataset prepared in {tfds_data_dir or 'the TFDS default directory'}")


def parse_urls(pairs: list[str]) -> dict[str, str]:
    urls = {}
    for pair in pairs:
        name, sep, url = pair.partition("=")
        if not sep or name not in SOURCES:
            raise SystemExit(f"--url expects NAME=URL with NAME one of {', '.join(SOURCES)}; got {pair!r}")
        urls[name] = url
    return urls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lra.data", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    get = commands.add_parser("download", help="fetch and unpack datasets under --data-dir")
    get.add_argument("names", nargs="*", metavar="NAME",
                     help=f"archives to fetch: {', '.join(SOURCES)} (default: all, unless --tfds is given)")
    get.add_argument("--data-dir", type=Path, default=REPO_ROOT / "data")
    get.add_argument("--tfds", nargs="+", choices=TFDS_NAMES, default=[], help="prepare these TFDS datasets")
    get.add_argument("--tfds-data-dir", default=None, help="TFDS data_dir (default: $TFDS_DATA_DIR or ~/tensorflow_datasets)")
    get.add_argument("--url", action="append", default=[], metavar="NAME=URL", help="fetch NAME from a mirror")
    get.add_argument("--delete-archives", action="store_true", help="remove data/downloads/<archive> after unpacking")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(SOURCES))
    if unknown:
        parser.error(f"unknown dataset {', '.join(unknown)}: choose from {', '.join(SOURCES)}")
    urls = parse_urls(args.url)
    names = args.names or ([] if args.tfds else list(SOURCES))
    for name in names:
        try:
            download(name, args.data_dir, urls.get(name))
        except RuntimeError as error:  # one line: the file, what is wrong, what to do
            raise SystemExit(f"[lra] FAILED: {error}") from None
        if args.delete_archives:
            (args.data_dir / "downloads" / SOURCES[name].archive).unlink(missing_ok=True)
    if args.delete_archives and (args.data_dir / "downloads").is_dir() and not any((args.data_dir / "downloads").iterdir()):
        shutil.rmtree(args.data_dir / "downloads")
    for name in args.tfds:
        prepare_tfds(name, args.tfds_data_dir)


if __name__ == "__main__":
    main()
