"""Report figures, each written as PNG and PDF (``FILE.png``, ``FILE.pdf``), one panel per task.

``--curves``: validation accuracy against the step of every run, one colour per attention and one line style
per setting and seed within it; chance, the task's shortcut on the validation split and each distinct
published number drawn once; the legend outside the axes.

``--plot``: the LRA paper's Fig. 3 (Tay et al. 2021) for our rows: x = training samples/s (mean over seeds,
log scale), y = accuracy (the independent test where the row has it, else the test; mean over seeds),
marker area proportional to peak memory, a number per row keyed in the legend; chance and the shortcut as
reference lines. Axis limits leave room for the largest marker, so nothing is clipped.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

MAX_MARKER_AREA = 900.0  # points², the largest peak memory of a panel
MIN_MARKER_AREA = 40.0
PART_WIDTH = 56  # characters of one setting part in a legend (a continued run's part names its checkpoint)
LEGEND_ROW = 0.2  # inches of panel height per legend entry (fontsize 7), so a legend never runs into the next panel
HSPACE = 0.3      # between panels, for the next panel's title
DASHES = ("-", "--", ":", "-.")
MARKERS = (None, "o", "s", "^", "D", "v", "P")
PALETTE = plt.get_cmap("tab10").colors


def save(fig, out: Path) -> list[Path]:
    """Write ``fig`` as ``out``'s stem ``.png`` and ``.pdf`` (parents created), legends outside included; close it."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".png"), out.with_suffix(".pdf")]
    for path in paths:
        fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return paths


def middle(text: str, width: int = PART_WIDTH) -> str:
    """``text`` cut to ``width`` characters in its middle, where a long run dir name differs least."""
    if len(text) <= width:
        return text
    keep = (width - 3) // 2
    return f"{text[:keep]} … {text[-keep:]}"


def legend_label(attention: str, setting: str) -> str:
    """``attention · setting`` with each long part of the setting (``init <run dir>/<checkpoint>``) cut short."""
    return " · ".join([attention, *(middle(part) for part in setting.split(" · ") if part)])


def colours(attentions) -> dict[str, tuple]:
    """One colour per attention, the same in both figures."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(sorted(set(attentions)))}


def line_style(index: int) -> dict:
    """The ``index``-th line style of an attention: dash pattern, then marker, so the first 28 differ."""
    return {"linestyle": DASHES[index % len(DASHES)], "marker": MARKERS[index // len(DASHES) % len(MARKERS)],
            "markersize": 4}


def published_lines(summary: list[dict], task: str) -> dict[float, str]:
    """Each distinct published number of a task once, named by the first row set beside it."""
    lines: dict[float, str] = {}
    for row in summary:
        if row["task"] == task and row["published"] is not None and row["published"] not in lines:
            lines[row["published"]] = legend_label(row["attention"], row["setting"])
    return lines


def plot_learning_curves(rows, summary: list[dict], out: Path) -> list[Path]:
    """:func:`draw_learning_curves` written to ``out`` (``.png`` and ``.pdf``)."""
    return save(draw_learning_curves(rows, summary), out)


def draw_learning_curves(rows, summary: list[dict]):
    """Validation accuracy (%) against the step of every run with a ``val_curve`` (``rows``: the report's
    :class:`lra.analysis.report_rows.Row`, ``summary``: their summaries); the figure."""
    runs = [(row, s, run) for row, s in zip(rows, summary) for run in sorted(row.runs, key=lambda r: r["seed"])
            if run.get("val_curve")]
    if not runs:
        raise ValueError("nothing to plot: no run has a val_curve (results.json written before val_curve existed?)")
    tasks = sorted({row.task for row, _, _ in runs})
    colour = colours(row.attention for row, _, _ in runs)
    heights = [max(4.5, LEGEND_ROW * (sum(row.task == task for row, _, _ in runs) + 2 + len(published_lines(summary, task))))
               for task in tasks]
    fig, axes = plt.subplots(len(tasks), 1, figsize=(10, sum(heights) * (1 + HSPACE)), squeeze=False,
                             gridspec_kw={"height_ratios": heights, "hspace": HSPACE})
    for ax, task in zip(axes[:, 0], tasks):
        of_task = [(row, s, run) for row, s, run in runs if row.task == task]
        counts: dict[str, int] = {}
        for row, s, run in of_task:
            steps, accuracy = zip(*run["val_curve"])
            index = counts[row.attention] = counts.get(row.attention, -1) + 1
            test = f", test {100 * run['test_acc']:.2f}" if run.get("test_acc") is not None else ""
            label = legend_label(row.attention, s["setting"]) + f" · seed {run['seed']}{test}"
            ax.plot(steps, [100 * a for a in accuracy], color=colour[row.attention], label=label, linewidth=1.3,
                    **line_style(index))
        first = of_task[0][1]
        if first["num_classes"]:
            ax.axhline(100 / first["num_classes"], color="grey", linestyle="--", linewidth=1,
                       label=f"chance: {100 / first['num_classes']:.2f}")
        cue = next((s["cue_val"] for _, s, _ in of_task if s["cue_val"] is not None), None)
        if cue is not None:
            ax.axhline(cue, color="black", linestyle=":", linewidth=1.5, label=f"cue (val): {cue:.2f}")
        for level, name in published_lines(summary, task).items():
            attention = name.split(" ")[0]
            ax.axhline(level, color=colour.get(attention, "black"), linestyle=(0, (8, 2, 1, 2, 1, 2)), linewidth=0.9,
                       alpha=0.8, label=f"published {name}: {level:.2f}")
        ax.set(title=task, xlabel="step", ylabel="validation accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def shown_accuracy(rows: list[dict]) -> tuple[str, str, str]:
    """The accuracy a panel shows and the cue on the same split: the independent test when every row has it,
    else the test (summary keys, and the split's name)."""
    if all(row["independent_test_acc_mean"] is not None for row in rows):
        return "independent_test_acc_mean", "cue_independent_test", "independent-test"
    return "test_acc_mean", "cue_test", "test"


def padded_limits(low: float, high: float, fraction: float, log: bool) -> tuple[float, float]:
    """``[low, high]`` widened by ``fraction`` of its span on each side (in log space for a log axis); a single
    value gets a span of its own size."""
    if log:
        low, high = math.log10(low), math.log10(high)
    span = high - low if high > low else (0.3 if log else abs(high) or 1.0)
    low, high = low - fraction * span, high + fraction * span
    return (10 ** low, 10 ** high) if log else (low, high)


def place_numbers(ax, points: list[tuple[float, float, float, str]]) -> None:
    """Write each point's number (``(x, y, marker radius in points, text)``) inside its marker where that spot is
    free, else at the first free spot around it, with a thin leader line: no number covers another."""
    scale = 72 / ax.figure.dpi  # display pixels -> points
    taken: list[tuple[float, float, float, float]] = []
    angles = [math.radians(a) for a in (45, 135, 225, 315, 0, 90, 180, 270)]
    for x, y, radius, text in points:
        cx, cy = (value * scale for value in ax.transData.transform((x, y)))
        half_w, half_h = 3 * len(text) + 2, 5
        candidates = [(0.0, 0.0)] + [(r * math.cos(a), r * math.sin(a)) for r in (radius + 6, radius + 16, radius + 28)
                                     for a in angles]
        for dx, dy in candidates:
            box = (cx + dx - half_w, cy + dy - half_h, cx + dx + half_w, cy + dy + half_h)
            if all(box[2] < t[0] or box[0] > t[2] or box[3] < t[1] or box[1] > t[3] for t in taken):
                break
        taken.append(box)
        leader = {"arrowstyle": "-", "linewidth": 0.5, "color": "0.3"} if (dx, dy) != (0.0, 0.0) else None
        ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha="center", va="center", fontsize=8,
                    arrowprops=leader, zorder=5)


def plot_accuracy_vs_throughput(summary: list[dict], out: Path) -> list[Path]:
    """:func:`draw_accuracy_vs_throughput` written to ``out`` (``.png`` and ``.pdf``)."""
    return save(draw_accuracy_vs_throughput(summary), out)


def draw_accuracy_vs_throughput(summary: list[dict]):
    """Accuracy vs training throughput, marker area ∝ peak memory, of the rows of ``summary`` that have both; one
    panel per task and device (samples/s of a GPU and of a CPU are not one axis); the figure."""
    points = [s for s in summary if s["test_acc_mean"] is not None and s["samples_per_s"]]
    if not points:
        raise ValueError("nothing to plot: no row has a completed run with test_acc and samples_per_s")
    panels = sorted({(s["task"], str(s["device"])) for s in points})
    colour = colours(s["attention"] for s in points)
    heights = [max(4.5, LEGEND_ROW * (sum(s["task"] == task and str(s["device"]) == device for s in points) + 2))
               for task, device in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights) * (1 + HSPACE)), squeeze=False,
                             gridspec_kw={"height_ratios": heights, "hspace": HSPACE})
    for ax, (task, device) in zip(axes[:, 0], panels):
        rows = [s for s in points if s["task"] == task and str(s["device"]) == device]
        accuracy, cue_key, split = shown_accuracy(rows)
        references = [(100 / rows[0]["num_classes"], "chance", "grey", "--")] if rows[0]["num_classes"] else []
        cue = next((s[cue_key] for s in rows if s[cue_key] is not None), None)
        if cue is not None:
            references.append((cue, f"cue ({rows[0]['shortcut'].split(':')[0]})", "black", ":"))
        speeds = [s["samples_per_s"] for s in rows]
        log = max(speeds) / min(speeds) > 5
        ys = [s[accuracy] for s in rows] + [level for level, *_ in references]
        ax.set_xscale("log" if log else "linear")
        ax.set_xlim(*padded_limits(min(speeds), max(speeds), 0.15, log))
        ax.set_ylim(*padded_limits(min(ys), max(ys), 0.1, False))
        largest = max((s["peak_mem_mib"] or 0.0) for s in rows) or 1.0
        handles, numbers = [], []
        for number, s in enumerate(rows, start=1):
            area = max(MAX_MARKER_AREA * (s["peak_mem_mib"] or 0.0) / largest, MIN_MARKER_AREA)
            x, y = s["samples_per_s"], s[accuracy]
            ax.scatter(x, y, s=area, color=colour[s["attention"]], alpha=0.45, edgecolor="black", linewidth=0.6,
                       clip_on=False, zorder=3)
            numbers.append((x, y, math.sqrt(area / math.pi), str(number)))
            memory = f", {s['peak_mem_mib'] / 1024:.1f} GiB" if s["peak_mem_mib"] else ""
            label = f"{number}: {legend_label(s['attention'], s['setting'])}"
            handles.append(Line2D([], [], marker="o", linestyle="", color=colour[s["attention"]], alpha=0.6,
                                  label=f"{label} ({y:.2f} %, {x:.1f}/s{memory})"))
        for level, name, line_colour, style in references:
            handles.append(ax.axhline(level, color=line_colour, linestyle=style, linewidth=1.2,
                                      label=f"{name}: {level:.2f} %"))
        place_numbers(ax, numbers)
        ax.set(title=f"{task} on {device.upper()}: accuracy vs training speed (marker area ∝ peak memory)",
               xlabel="training throughput (samples/s" + (", log scale)" if log else ")"),
               ylabel=f"{split} accuracy (%)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig
