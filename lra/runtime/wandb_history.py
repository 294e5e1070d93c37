"""What a W&B run dir holds, read without the network: the run's id and the metrics each part of it logged.

A run of ``lra.train`` is one W&B run however often it is stopped and resumed: the resumed process opens the run
of the first one (its id, read from ``<run dir>/wandb/{offline-,}run-<time>-<id>``, with ``resume="allow"``) and
logs only the points the run does not hold yet (:class:`lra.runtime.wandb_logger.WandbLogger`). Offline, each part
is a folder of its own with the same id; ``wandb sync`` uploads them into that one run.

The points a part logged come from its ``run-<id>.wandb`` file (:func:`history`), W&B's record log: the LevelDB log
format (32 KiB blocks; each record a 7-byte header, CRC-32 (4 bytes), length (2, little-endian) and type (1: whole,
2/3/4: first/middle/last piece), then its bytes) after a 7-byte file header (``:W&B``, magic ``0xBEE1``, version),
each record a ``wandb_internal_pb2.Record`` protobuf. A file cut short by a kill is read up to its last whole record.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7
FILE_HEADER = b":W&B"
RUN_FOLDER = re.compile(r"^(offline-)?run-\d{8}_\d{6}-(?P<id>[A-Za-z0-9]+)$")
BOOKKEEPING = ("_step", "_runtime", "_timestamp", "trainer/global_step")


def run_folders(wandb_dir: Path) -> list[Path]:
    """The W&B run folders under ``<run dir>/wandb``, oldest first (their names start with the time)."""
    wandb_dir = Path(wandb_dir)
    if not wandb_dir.is_dir():
        return []
    found = [path for path in wandb_dir.iterdir() if path.is_dir() and RUN_FOLDER.match(path.name)]
    return sorted(found, key=lambda path: path.name.removeprefix("offline-"))


def run_id(wandb_dir: Path) -> str | None:
    """The id of the W&B run a run dir's earlier parts logged to (the newest folder's), or None."""
    folders = run_folders(wandb_dir)
    return RUN_FOLDER.match(folders[-1].name)["id"] if folders else None


def records(path: Path):
    """The payloads of the records of a W&B ``.wandb`` file, in order, up to the last whole one."""
    data = Path(path).read_bytes()
    if not data.startswith(FILE_HEADER):
        return
    offset, pieces = HEADER, []
    while offset + HEADER <= len(data):
        if BLOCK - offset % BLOCK < HEADER:  # a block's tail too short for a header is padding
            offset += BLOCK - offset % BLOCK
            continue
        _, length, kind = struct.unpack_from("<IHB", data, offset)
        start, offset = offset + HEADER, offset + HEADER + length
        if kind == 0 or offset > len(data):  # zero padding, or a record cut short
            return
        pieces.append(data[start:offset])
        if kind in (1, 4):  # whole, or the last piece
            yield b"".join(pieces)
            pieces = []


def history(path: Path) -> list[dict]:
    """The history rows (``run.log`` calls) of a ``.wandb`` file, each ``{key: value}``."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for payload in records(path):
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(payload)
        except Exception:  # a damaged record: what came before it is whole
            break
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def logged_points(wandb_dir: Path, run: str) -> set[tuple[str, int]]:
    """``(metric, trainer/global_step)`` of every point the parts of W&B run ``run`` under ``wandb_dir`` logged."""
    points = set()
    for folder in run_folders(wandb_dir):
        if RUN_FOLDER.match(folder.name)["id"] != run:
            continue
        for path in folder.glob("run-*.wandb"):
            for row in history(path):
                step = row.get("trainer/global_step")
                points |= {(key, step) for key in row if key not in BOOKKEEPING}
    return points
