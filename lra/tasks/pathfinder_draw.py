"""Pathfinder geometry and drawing (Linsley et al. 2018): snakes of paddles, distractors, markers.

Coordinates are continuous pixel units of the final image: ``(x, y)`` with ``0 <= x, y <= resolution``;
pixel ``(row, col)`` covers ``[col, col+1) x [row, row+1)``. A *paddle* is a line segment of
``paddle_length`` and ``paddle_thickness``; a *snake* is a chain of paddles where paddle ``k+1`` starts
``paddle_gap`` after the end of paddle ``k``. Each new paddle direction ``theta_k + dtheta`` is drawn
from ``num_directions`` candidates (a jittered grid over the circle) with weight

    w(dtheta) = cos(min(|dtheta| * continuity, pi/2))**2 * free(dtheta)        (docs/design.md §4)

where ``free`` is 1 when the candidate stays inside the image and keeps ``paddle_margin`` of empty space
(edge to edge) to every other snake, to its own earlier paddles and to every reserved marker disc, else 0.
Free space is tested exactly with segment-segment distances (no raster), so a snake never touches
another one: connectivity in the image is the label, up to anti-aliasing.

Shapes: a snake is a float array ``(n_paddles, 2, 2)`` = (paddle, start/end, x/y).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw


@dataclass(frozen=True)
class SnakeGeometry:
    """Lengths in final-image pixels; see ``pathfinder_generator.parameters`` for the per-resolution values."""

    resolution: int
    paddle_length: float
    paddle_thickness: float
    paddle_gap: float
    paddle_margin: float
    marker_radius: float
    continuity: float
    num_directions: int = 32

    @property
    def clearance(self) -> float:
        """Centre-line distance two paddles must keep: thickness (two half widths) + margin."""
        return self.paddle_thickness + self.paddle_margin

    @property
    def disc_clearance(self) -> float:
        """Distance from a marker centre that another paddle's centre line must keep."""
        return self.marker_radius + self.paddle_thickness / 2 + self.paddle_margin


def point_segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance from points ``p (..., 2)`` to segments ``a-b (..., 2)`` (broadcast)."""
    return np.sqrt(_point_segment_d2(p[..., 0], p[..., 1], a[..., 0], a[..., 1], b[..., 0], b[..., 1]))


def _point_segment_d2(px, py, ax, ay, bx, by):
    """Squared point-to-segment distance on coordinate arrays (broadcast); degenerate segments are points."""
    dx, dy = bx - ax, by - ay
    t = np.clip(((px - ax) * dx + (py - ay) * dy) / np.maximum(dx * dx + dy * dy, 1e-12), 0.0, 1.0)
    ex, ey = ax + t * dx - px, ay + t * dy - py
    return ex * ex + ey * ey


def segment_distances(candidates: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """Minimum distance between each of ``candidates (K, 2, 2)`` and each of ``segments (M, 2, 2)`` -> ``(K, M)``.

    Zero when two segments cross, else the smallest of the four endpoint-to-segment distances.
    """
    cx, cy = candidates[:, None, :, 0], candidates[:, None, :, 1]  # (K, 1, 2): the two ends
    sx, sy = segments[None, :, :, 0], segments[None, :, :, 1]  # (1, M, 2)
    ends_to_segments = _point_segment_d2(
        cx, cy, sx[..., :1], sy[..., :1], sx[..., 1:], sy[..., 1:]).min(-1)  # (K, M)
    segments_to_ends = _point_segment_d2(
        sx, sy, cx[..., :1], cy[..., :1], cx[..., 1:], cy[..., 1:]).min(-1)  # (K, M)
    d2 = np.minimum(ends_to_segments, segments_to_ends)

    def side(ax, ay, bx, by, px, py):  # sign of (b - a) x (p - a)
        return np.sign((bx - ax) * (py - ay) - (by - ay) * (px - ax))

    p0x, p0y, p1x, p1y = (candidates[:, None, i, j] for i in (0, 1) for j in (0, 1))
    q0x, q0y, q1x, q1y = (segments[None, :, i, j] for i in (0, 1) for j in (0, 1))
    crossing = (side(p0x, p0y, p1x, p1y, q0x, q0y) * side(p0x, p0y, p1x, p1y, q1x, q1y) < 0) & (
        side(q0x, q0y, q1x, q1y, p0x, p0y) * side(q0x, q0y, q1x, q1y, p1x, p1y) < 0)
    return np.where(crossing, 0.0, np.sqrt(d2))


def grow_snake(
    rng: np.random.Generator, geometry: SnakeGeometry, start: np.ndarray, n_paddles: int,
    obstacles: np.ndarray, discs: np.ndarray, border: float, own_disc: bool = False,
) -> np.ndarray | None:
    """Grow ``n_paddles`` paddles from ``start (2,)``; ``None`` when some step has no free direction.

    ``obstacles (M, 2, 2)`` are other snakes' paddles, ``discs (D, 2)`` reserved marker centres; paddle
    endpoints stay ``border`` away from the image edge. With ``own_disc`` the start is a marker too: paddles
    from the third on keep clear of it (the first two touch it by construction).
    """
    g = geometry
    step = 2 * np.pi / g.num_directions
    grid = np.arange(g.num_directions) * step - np.pi  # dtheta in [-pi, pi)
    reach = g.paddle_gap + g.paddle_length + g.clearance  # farther paddles cannot block this step
    start = np.asarray(start, dtype=float)
    own_discs = np.concatenate([discs, start[None]]) if own_disc else discs
    paddles = np.empty((n_paddles, 2, 2))
    position, theta = start, 0.0
    for k in range(n_paddles):
        blocking = np.concatenate([obstacles, paddles[: max(k - 1, 0)]])  # own paddles but the previous one
        if len(blocking):
            near = point_segment_distance(position, blocking[:, 0], blocking[:, 1])
            if k == 0 and near.min() < g.clearance:
                return None
            blocking = blocking[near < reach]
        if k == 0:  # first paddle: any direction, uniform
            angles = grid + rng.uniform(0, step)
            weights = np.ones_like(grid)
            gap = 0.0
        else:
            dtheta = grid + rng.uniform(-step / 2, step / 2)
            dtheta = dtheta[np.abs(dtheta) * g.continuity < np.pi / 2]  # the rest has weight 0
            angles = theta + dtheta
            weights = np.cos(np.minimum(np.abs(dtheta) * g.continuity, np.pi / 2)) ** 2
            gap = g.paddle_gap
        direction = np.stack([np.cos(angles), np.sin(angles)], -1)  # (K, 2)
        begin = position + gap * direction
        end = begin + g.paddle_length * direction
        candidates = np.stack([begin, end], 1)  # (K, 2, 2)
        free = ((candidates >= border) & (candidates <= g.resolution - border)).all(axis=(1, 2))
        if len(blocking):
            free &= segment_distances(candidates, blocking).min(1) >= g.clearance
        blocking_discs = own_discs if k >= 2 else discs
        if len(blocking_discs):
            free &= point_segment_distance(blocking_discs[None], begin[:, None], end[:, None]).min(1) >= g.disc_clearance
        cumulative = np.cumsum(weights * free)
        if cumulative[-1] <= 0:
            return None
        choice = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        paddles[k] = candidates[choice]
        position, theta = end[choice], angles[choice]
    return paddles


def end_is_clear(geometry: SnakeGeometry, snake: np.ndarray, obstacles: np.ndarray, discs: np.ndarray) -> bool:
    """Whether a marker at the snake's last point keeps its clearance from other paddles, discs and its own body."""
    end = snake[-1, 1]
    others = np.concatenate([obstacles, snake[:-2]])
    if len(others) and point_segment_distance(end, others[:, 0], others[:, 1]).min() < geometry.disc_clearance:
        return False
    return not len(discs) or np.sqrt(((discs - end) ** 2).sum(-1)).min() >= 2 * geometry.marker_radius + geometry.paddle_margin


def render(
    geometry: SnakeGeometry, snakes: list[np.ndarray], markers: np.ndarray, antialias: int, contrast: int = 255
) -> np.ndarray:
    """Draw paddles and filled marker circles at ``antialias`` x resolution, box-downsample -> uint8 ``(R, R)``."""
    scale = antialias
    canvas = Image.new("L", (geometry.resolution * scale,) * 2, 0)
    draw = ImageDraw.Draw(canvas)
    width = max(1, round(geometry.paddle_thickness * scale))
    for snake in snakes:
        for (x0, y0), (x1, y1) in snake * scale - 0.5:
            draw.line([(x0, y0), (x1, y1)], fill=contrast, width=width)
    radius = geometry.marker_radius * scale
    for x, y in markers * scale - 0.5:
        draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=contrast)
    small = canvas.resize((geometry.resolution,) * 2, Image.BOX)
    return np.asarray(small, dtype=np.uint8)
