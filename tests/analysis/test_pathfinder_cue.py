"""Marker-distance cue of generated Pathfinder data: the band search, the metadata reader and the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from tests.conftest import run_cli
from PIL import Image

from lra.analysis.pathfinder_cue import accuracy, best_band, marker_distances
from lra.tasks import pathfinder_generator


def test_band_search_finds_a_separating_band():
    """Positives in [10, 12], negatives outside: the best band is perfect and spans exactly the positives."""
    rng = np.random.default_rng(0)
    positives = rng.uniform(10, 12, 500)
    negatives = np.concatenate([rng.uniform(2, 9.5, 250), rng.uniform(12.5, 20, 250)])
    distances = np.concatenate([positives, negatives])
    labels = np.concatenate([np.ones(500, int), np.zeros(500, int)])
    cue = best_band(distances, labels)
    assert cue.accuracy == 1.0 and cue.inside == 1 and cue.count == 1000
    assert (cue.low, cue.high) == (positives.min(), positives.max())
    assert accuracy(cue, distances, labels) == 1.0


def test_band_search_without_signal_stays_near_chance():
    """Labels independent of distance: the best in-sample band is a little above 0.5, held out it is ~0.5."""
    rng = np.random.default_rng(1)
    distances, labels = rng.uniform(0, 20, 20000), rng.integers(0, 2, 20000)
    cue = best_band(distances[0::2], labels[0::2])
    assert 0.5 <= cue.accuracy < 0.53
    assert abs(accuracy(cue, distances[1::2], labels[1::2]) - 0.5) < 0.02


def test_inverted_band_when_negatives_sit_inside():
    """Negatives in the band, positives outside: the rule predicts label 0 inside."""
    distances = np.array([1.0, 2.0, 5.0, 5.5, 6.0, 9.0, 10.0])
    labels = np.array([1, 1, 0, 0, 0, 1, 1])
    cue = best_band(distances, labels)
    assert (cue.accuracy, cue.inside, cue.low, cue.high) == (1.0, 0, 5.0, 6.0)


def test_no_band_beats_the_majority_label():
    """Each distance has as many positives as negatives: the rule is 'majority everywhere', accuracy 0.5."""
    distances = np.array([1.0, 1.0, 2.0, 2.0, 3.0, 3.0])
    labels = np.array([0, 1, 1, 0, 0, 1])
    cue = best_band(distances, labels)
    assert (cue.accuracy, cue.low, cue.high) == (0.5, 1.0, 3.0)


@pytest.mark.process
def test_distances_match_the_marker_pixels(tmp_path):
    """Metadata marker centres (generator) vs the centroids of the 255-valued blobs in each PNG."""
    out = tmp_path / "curv_baseline"
    # what `python -m lra.tasks.pathfinder generate --difficulty 6 --count 12` runs (the CLI: test_pathfinder_generator)
    pathfinder_generator.generate(out, difficulty=6, count=12)
    distances, labels = marker_distances(out)
    assert len(distances) == 12 and set(labels) == {0, 1}
    for index, distance in enumerate(distances):
        image = np.asarray(Image.open(out / "imgs" / "0" / f"sample_{index}.png"))
        bright = np.argwhere(image == 255).astype(float)
        far = np.linalg.norm(bright[:, None] - bright[None], axis=-1)
        first = far[far.argmax() // len(bright)] < 3.0  # pixels of the blob holding one extreme pixel
        centroids = bright[first].mean(0), bright[~first].mean(0)
        assert abs(np.linalg.norm(centroids[0] - centroids[1]) - distance) < 1.0

    cli = run_cli(["-m", "lra.analysis.pathfinder_cue", str(out)])
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "marker-distance cue" in cli.stdout and "odd-numbered" in cli.stdout


def test_release_metadata_without_markers_is_a_clear_error(tmp_path):
    (tmp_path / "metadata").mkdir()
    (tmp_path / "metadata" / "0.npy").write_text("imgs/0 sample_0.png 0 1 1.0 14 4 2 0.5 2 1\n")
    with pytest.raises(ValueError, match=r"0\.npy:1: no marker centres"):
        marker_distances(tmp_path)
