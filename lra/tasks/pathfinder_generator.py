"""Pathfinder generator (Linsley et al. 2018, drewlinsley/pathfinder) writing the LRA release layout.

Each image holds two *target* snakes of ``contour_length`` paddles grown from seeds ``seed_distance``
apart, *distractor* snakes of ``contour_length // 3`` paddles added at random free places until
``fill_failures`` placements in a row fail (the image is full), and two markers (filled circles).
Label 1 (connected): markers at both ends of target snake A. Label 0: markers at the far end of A and at
the seed of target snake B, which starts ``seed_distance`` from A's seed (the original's construction:
origin tip of one snake, terminal tip of the same or the other). The marker distance has about the same
mean under both labels but a wider spread for label 0, so it is a partial cue: a distance band alone scores
72% at contour length 6 and 56% at 14 (``python -m lra.analysis.pathfinder_cue DIR``). All four target ends
keep marker clearance whatever the label, so free space is no cue. Snakes never touch
(``paddle_margin`` of free space, edge to edge), so no image is ambiguous by construction.

Per-resolution parameters (docs/design.md §4 gives 32 px: paddle length 2, thickness 0.5, marker radius 1.5,
seed distance 7, continuity 1.0, anti-aliasing x2). **Decision:** 64/128/256 px scale every length
(paddle length, thickness, gap, margin, marker radius, seed distance) by ``resolution / 32`` and keep
contour lengths, continuity and anti-aliasing: Path-X (128 px) is the 32 px geometry x4, the same scene
at 16x the sequence length. Paddle gap 0.5 and margin 2.0 (32 px) are our choice (a decision in docs/design.md §4): with a
2 px margin no two snakes touch after anti-aliasing (a 1 px margin packs them tighter, but then about a third
of the negatives look connected in the pixels).

Layout (the official release, read by ``lra.tasks.pathfinder``)::

    OUT/imgs/<batch>/sample_<i>.png      grayscale uint8, resolution x resolution, never empty
    OUT/metadata/<batch>.npy             TEXT lines, one per image:
        imgs/<batch> sample_<i>.png <i> <label> <continuity> <contour_length> <distractor_length>
        <paddle_length> <paddle_thickness> <paddle_margin> <num_contrasts> <x0> <y0> <x1> <y1>

The first eleven fields follow the release; the last four are the marker centres in pixels (ours).
Image ``g = batch * batch_size + i`` depends only on ``(seed, g, parameters)``: its RNG is
``SeedSequence([seed, g])``; labels are balanced exactly per pair ``(2j, 2j+1)``.

    python -m lra.tasks.pathfinder generate --out data/pathfinder32/curv_contour_length_14 \\
        --resolution 32 --difficulty 14 --count 200000 --seed 0 --workers 8
"""

from __future__ import annotations

import argparse
import io
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from lra.tasks.pathfinder_draw import SnakeGeometry, end_is_clear, grow_snake, render

DIFFICULTY_DIRS = {6: "curv_baseline", 9: "curv_contour_length_9", 14: "curv_contour_length_14"}
RESOLUTIONS = (32, 64, 128, 256)


@dataclass(frozen=True)
class PathfinderParams:
    """Everything that changes an image besides ``(seed, index)``; lengths in final-image pixels."""

    geometry: SnakeGeometry
    contour_length: int
    distractor_length: int
    seed_distance: float
    antialias: int = 2
    fill_failures: int = 20
    target_retries: int = 100


def parameters(resolution: int, difficulty: int) -> PathfinderParams:
    """The 32 px geometry of docs/design.md §4 scaled by ``resolution / 32``; ``difficulty`` = contour length."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"--resolution must be one of {RESOLUTIONS} (the release sizes), got {resolution}")
    if difficulty not in DIFFICULTY_DIRS:
        raise ValueError(f"--difficulty must be a contour length in {sorted(DIFFICULTY_DIRS)}, got {difficulty}")
    scale = resolution / 32
    geometry = SnakeGeometry(
        resolution=resolution, paddle_length=2.0 * scale, paddle_thickness=0.5 * scale, paddle_gap=0.5 * scale,
        paddle_margin=2.0 * scale, marker_radius=1.5 * scale, continuity=1.0,
    )
    return PathfinderParams(geometry, difficulty, difficulty // 3, seed_distance=7.0 * scale)


def label_of(seed: int, index: int) -> int:
    """Exactly one of the images ``2j, 2j+1`` is positive; which one is drawn from ``SeedSequence([seed, j, 1])``."""
    positive = np.random.default_rng(np.random.SeedSequence([seed, index // 2, 1])).integers(2)
    return int(index % 2 == positive)


def _targets(rng: np.random.Generator, params: PathfinderParams) -> tuple[np.ndarray, np.ndarray]:
    """Two target snakes ``(contour_length, 2, 2)`` from seeds ``seed_distance`` apart, ends clear for markers."""
    g = params.geometry
    border = g.marker_radius + g.paddle_margin
    for _ in range(params.target_retries):
        seed_a = rng.uniform(border, g.resolution - border, size=2)
        angle = rng.uniform(0, 2 * np.pi)
        seed_b = seed_a + params.seed_distance * np.array([np.cos(angle), np.sin(angle)])
        if not ((seed_b >= border) & (seed_b <= g.resolution - border)).all():
            continue
        a = grow_snake(rng, g, seed_a, params.contour_length, np.empty((0, 2, 2)), seed_b[None], border, own_disc=True)
        if a is None or not end_is_clear(g, a, np.empty((0, 2, 2)), seed_b[None]):
            continue
        discs = np.stack([seed_a, a[-1, 1]])
        b = grow_snake(rng, g, seed_b, params.contour_length, a, discs, border, own_disc=True)
        if b is not None and end_is_clear(g, b, a, discs):
            return a, b
    raise RuntimeError(
        f"could not place two target snakes in {params.target_retries} tries at {g.resolution} px with contour "
        f"length {params.contour_length}: the image is too small for these parameters (pathfinder_generator.parameters)"
    )


def sample(seed: int, index: int, params: PathfinderParams) -> tuple[np.ndarray, int, np.ndarray]:
    """Image ``index``: ``(uint8 (R, R), label, marker centres (2, 2) as (x, y))``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
    g = params.geometry
    a, b = _targets(rng, params)
    snakes = [a, b]
    discs = np.stack([a[0, 0], a[-1, 1], b[0, 0], b[-1, 1]])
    border = g.paddle_thickness / 2 + g.paddle_margin / 2
    failures = 0
    while failures < params.fill_failures:
        start = rng.uniform(border, g.resolution - border, size=2)
        distractor = grow_snake(rng, g, start, params.distractor_length, np.concatenate(snakes), discs, border)
        if distractor is None:
            failures += 1
        else:
            snakes.append(distractor)
            failures = 0
    label = label_of(seed, index)
    markers = np.stack([a[-1, 1], a[0, 0] if label else b[0, 0]])
    return render(g, snakes, markers, params.antialias), label, markers


def _write(job: tuple[int, int, PathfinderParams, Path, int]) -> tuple[int, str]:
    """Render image ``index``, write its PNG, return ``(index, metadata line)``."""
    seed, index, params, out, batch_size = job
    batch, i = divmod(index, batch_size)
    image, label, markers = sample(seed, index, params)
    folder = out / "imgs" / str(batch)
    buffer = io.BytesIO()
    Image.fromarray(image, mode="L").save(buffer, format="PNG")
    (folder / f"sample_{i}.png").write_bytes(buffer.getvalue())
    g = params.geometry
    fields = [
        f"imgs/{batch}", f"sample_{i}.png", i, label, g.continuity, params.contour_length, params.distractor_length,
        g.paddle_length, g.paddle_thickness, g.paddle_margin, 1, *(f"{v:.3f}" for v in markers.ravel()),
    ]
    return index, " ".join(map(str, fields))


def generate(
    out: Path | str, resolution: int = 32, difficulty: int = 14, count: int = 1000, seed: int = 0,
    workers: int = 1, batch_size: int = 1000, params: PathfinderParams | None = None,
) -> dict:
    """Write ``count`` images in the release layout under ``out`` with ``workers`` processes; return stats.

    ``out`` is the difficulty directory itself (e.g. ``.../pathfinder32/curv_contour_length_14``).
    """
    out = Path(out)
    params = params or parameters(resolution, difficulty)
    if count < 1 or batch_size < 1 or workers < 1 or seed < 0:
        raise ValueError(f"--count, --batch-size and --workers must be >= 1 and --seed >= 0; got {count}, {batch_size}, {workers}, {seed}")
    if (out / "metadata").exists() and any((out / "metadata").iterdir()):
        raise FileExistsError(f"{out / 'metadata'} is not empty: delete {out} or choose another --out")
    n_batches = -(-count // batch_size)
    for batch in range(n_batches):
        (out / "imgs" / str(batch)).mkdir(parents=True, exist_ok=True)
    (out / "metadata").mkdir(parents=True, exist_ok=True)
    lines: list[list[str]] = [[] for _ in range(n_batches)]
    jobs = ((seed, index, params, out, batch_size) for index in range(count))
    start = time.perf_counter()
    with tqdm(total=count, desc=f"Pathfinder{params.geometry.resolution} -> {out}", unit="img") as progress:
        if workers == 1:
            results = map(_write, jobs)
            for index, line in results:
                lines[index // batch_size].append(line)
                progress.update()
        else:
            with ProcessPoolExecutor(workers) as pool:
                for index, line in pool.map(_write, jobs, chunksize=max(1, min(16, count // (4 * workers)))):
                    lines[index // batch_size].append(line)
                    progress.update()
    for batch, batch_lines in enumerate(lines):
        (out / "metadata" / f"{batch}.npy").write_text("\n".join(batch_lines) + "\n")
    seconds = time.perf_counter() - start
    stats = {"images": count, "seconds": seconds, "images_per_s": count / seconds, "batches": n_batches}
    print(f"wrote {count} images in {seconds:.1f} s ({stats['images_per_s']:.1f} images/s, {workers} workers) to {out}")
    return stats


def main(argv: list[str] | None = None) -> dict:
    """``generate`` command line (``python -m lra.tasks.pathfinder generate`` delegates its argv here)."""
    parser = argparse.ArgumentParser(prog="python -m lra.tasks.pathfinder generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the difficulty directory to create (holds imgs/, metadata/)")
    parser.add_argument("--resolution", type=int, default=32, choices=RESOLUTIONS)
    parser.add_argument("--difficulty", type=int, default=14, choices=sorted(DIFFICULTY_DIRS), help="contour length")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=1000, help="images per imgs/<batch> folder and metadata file")
    args = parser.parse_args(argv)
    return generate(args.out, args.resolution, args.difficulty, args.count, args.seed, args.workers, args.batch_size)


if __name__ == "__main__":
    main()
