"""How much of a generated Pathfinder label the marker distance alone gives away.

In Linsley et al.'s construction (and ours) the markers of a positive image are the two ends of one
snake, those of a negative image the end of one target snake and the seed of the other, which starts
``seed_distance`` away. Both distances have about the same mean, but the negative ones spread wider, so
"label 1 iff the distance lies in a band" beats chance without looking at any path. This is the accuracy a
model can reach through that shortcut; compare trained models with it, not only with 50%.

    python -m lra.analysis.pathfinder_cue data/lra_release/pathfinder32/curv_baseline

Reads the marker centres our generator appends to each metadata line (fields 12-15); the LRA release
does not have them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lra.tasks.pathfinder import labelled_rows

MARKER_FIELDS = slice(11, 15)  # x0 y0 x1 y1 after the eleven release fields


@dataclass(frozen=True)
class BandCue:
    """``label = inside`` for ``low <= distance <= high`` gets ``accuracy`` on ``count`` images."""

    accuracy: float
    low: float
    high: float
    inside: int
    count: int


def marker_distances(root: Path | str) -> tuple[np.ndarray, np.ndarray]:
    """Marker distances in pixels and labels of every image listed under ``root/metadata``."""
    root = Path(root)
    distances, labels = [], []
    for path, number, row in labelled_rows(root):
        if len(row) < MARKER_FIELDS.stop:
            raise ValueError(
                f"{path}:{number}: no marker centres (fields 12-15); only data written by "
                "'python -m lra.tasks.pathfinder generate' has them"
            )
        x0, y0, x1, y1 = map(float, row[MARKER_FIELDS])
        distances.append(np.hypot(x1 - x0, y1 - y0))
        labels.append(int(row[3]))
    if not labels:
        raise FileNotFoundError(f"no metadata lines under {root / 'metadata'}: generate the data first")
    return np.asarray(distances), np.asarray(labels)


def best_band(distances: np.ndarray, labels: np.ndarray) -> BandCue:
    """The most accurate ``label = inside`` rule over all bands ``[low, high]`` of observed distances.

    Exact: on the distinct distances in increasing order, a band with label 1 inside scores
    ``negatives + sum of (positives - negatives) over the band``, so the best band is the maximum-sum
    contiguous run (Kadane's algorithm, via prefix sums); label 0 inside flips the signs.
    """
    values, group = np.unique(distances, return_inverse=True)
    margin = np.bincount(group, weights=2 * labels - 1, minlength=len(values))  # positives - negatives per value
    total, positives = len(labels), int(labels.sum())
    majority = int(2 * positives >= total)
    rules = [BandCue(max(positives, total - positives) / total, float(values[0]), float(values[-1]), majority, total)]
    for inside, sign, outside_correct in ((1, 1, total - positives), (0, -1, positives)):
        prefix = np.concatenate([[0.0], np.cumsum(sign * margin)])
        lowest_before = np.minimum.accumulate(prefix)
        end = int(np.argmax(prefix - lowest_before))
        start = int(np.argmin(prefix[: end + 1]))
        if end > start:
            correct = outside_correct + prefix[end] - prefix[start]
            rules.append(BandCue(correct / total, float(values[start]), float(values[end - 1]), inside, total))
    return max(rules, key=lambda rule: rule.accuracy)


def accuracy(cue: BandCue, distances: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy of ``cue``'s rule on other images (fit on one half, score on the other: no selection bias)."""
    in_band = (distances >= cue.low) & (distances <= cue.high)
    return float((np.where(in_band, cue.inside, 1 - cue.inside) == labels).mean())


def main(argv: list[str] | None = None) -> BandCue:
    """Command line: ``python -m lra.analysis.pathfinder_cue DIR``."""
    parser = argparse.ArgumentParser(prog="python -m lra.analysis.pathfinder_cue", description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path, help="a generated difficulty folder (holds imgs/, metadata/)")
    args = parser.parse_args(argv)
    distances, labels = marker_distances(args.data_dir)
    cue = best_band(distances[0::2], labels[0::2])
    held_out = accuracy(cue, distances[1::2], labels[1::2])
    for label in (1, 0):
        chosen = distances[labels == label]
        print(f"label {label}: marker distance {chosen.mean():.2f} ± {chosen.std():.2f} px ({len(chosen)} images)")
    print(
        f"marker-distance cue: label {cue.inside} iff {cue.low:.2f} <= distance <= {cue.high:.2f} px "
        f"(fit on the {cue.count} even-numbered images: {cue.accuracy:.3f}) -> accuracy {held_out:.3f} "
        f"on the {len(labels) - cue.count} odd-numbered ones (chance 0.5)"
    )
    return cue


if __name__ == "__main__":
    main()
