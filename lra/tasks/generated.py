"""What a data generator may write over: nothing but its own earlier output.

A generator writes only into a folder that is absent, empty, or holds exactly files that an earlier generation
with the same settings wrote. It proves the last case with ``generated.json`` (:data:`MANIFEST`), which it writes
beside its files: the generator's name, its settings, and the SHA-256 of each file, recorded *before* the file is
renamed into place, so a generation killed between two files leaves a folder the next one accepts, and a file that
is there is always one the manifest records. Anything else (a user's own ``basic_train.tsv``, a file edited since,
a set generated with other settings, an unknown file) makes :func:`foreign_file` name it, and the generator refuses
before it writes anything. **Decision:** content hashes, not size + mtime (:func:`lra.tasks.files.file_fingerprint`):
a copied folder keeps its manifest valid, an edit to the same size does not; hashing costs one read of the files,
only when a generation is about to run (full ListOps: about 0.5 GB).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from lra.tasks.files import atomic_write_text

MANIFEST = "generated.json"


class GenerationRefused(FileExistsError):
    """A generation that would overwrite ``name`` in ``out`` (``why`` says what it is); nothing was written.
    ``command`` is the generation's command line with an ``--out`` beside ``out``, for the message."""

    def __init__(self, out: Path, name: str, why: str, command: str):
        self.out, self.name, self.why, self.command = out, name, why, command
        super().__init__(
            f"refusing to generate into {out}: it holds {name}, {why}. A generator writes only into an empty or absent "
            f"folder, or over the files it wrote itself with the same settings (recorded in {out / MANIFEST}). "
            f"Generate into an empty or new folder ('{command}'), or move {name} away"
        )


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def plain(settings: dict) -> dict:
    """``settings`` as JSON gives it back (tuples -> lists, keys -> str), so a stored manifest compares equal."""
    return json.loads(json.dumps(settings))


def read_manifest(out: Path) -> dict | None:
    """The manifest in ``out``, None when absent; one that does not parse counts as absent (it proves nothing)."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None


def is_temporary(name: str) -> bool:
    """A temporary file of :func:`lra.tasks.files.atomic_write` (``.<name>.<random>.tmp``), left by a killed write."""
    return name.startswith(".") and name.endswith(".tmp")


def existing_files(out: Path) -> list[str]:
    """Every file under ``out`` as a path relative to it, sorted; the manifest and temporary files left out."""
    found = []
    for folder, _, names in os.walk(out):
        for name in names:
            relative = (Path(folder) / name).relative_to(out).as_posix()
            if relative != MANIFEST and not is_temporary(name):
                found.append(relative)
    return sorted(found)


def foreign_file(out: Path, generator: str, settings: dict) -> tuple[str, str] | None:
    """``(name, why)`` of the first file under ``out`` that a generation by ``generator`` with ``settings`` did not
    write; None when ``out`` is absent, empty, or holds only such files. ``out`` that is a file is itself foreign."""
    if out.exists() and not out.is_dir():
        return str(out), "a file where the output folder should be"
    files = existing_files(out) if out.is_dir() else []
    if not files:
        return None
    manifest = read_manifest(out)
    if manifest is None:
        return files[0], f"which no generation recorded (no readable {MANIFEST})"
    if manifest.get("generator") != generator or manifest.get("settings") != plain(settings):
        return files[0], f"from a generation with other settings ({MANIFEST}: {manifest.get('generator')} {manifest.get('settings')})"
    for name in files:
        recorded = manifest["files"].get(name)
        if recorded is None:
            return name, f"which {MANIFEST} does not list"
        if recorded != file_digest(out / name):
            return name, f"changed since it was generated (its content differs from the hash {MANIFEST} records)"
    return None


class Manifest:
    """The manifest of the generation now writing ``out``: kept on disk, one file's hash added before that file is
    renamed into place. Starts from the existing manifest when it records the same generator and settings (the
    files it lists are then the ones :func:`foreign_file` just checked), else empty."""

    def __init__(self, out: Path, generator: str, settings: dict):
        self.out = out
        existing = read_manifest(out)
        same = existing is not None and existing.get("generator") == generator and existing.get("settings") == plain(settings)
        self.content = {"generator": generator, "settings": plain(settings), "files": existing["files"] if same else {}}
        self.save()

    def holds(self, name: str, data_digest: str) -> bool:
        """Whether ``out/name`` is already there with this content (then it need not be written again)."""
        return self.content["files"].get(name) == data_digest and (self.out / name).is_file()

    def record(self, name: str, data_digest: str) -> None:
        self.content["files"][name] = data_digest
        self.save()

    def save(self) -> None:
        atomic_write_text(self.out / MANIFEST, json.dumps(self.content, indent=1, sort_keys=True) + "\n")
