"""Report figures. ``--plot FILE``: test accuracy vs training throughput, marker area ∝ peak memory;
``--curves FILE``: validation accuracy vs step of every run.

``--plot`` follows the layout of the Proxyformer paper's Fig. 1 (Lee, Lee, Shin, AAAI 2024): one point per report row,
x = training samples/s (mean over seeds), y = mean test accuracy, marker area proportional to the
mean peak memory; one panel per task.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MAX_MARKER_AREA = 900.0  # points², for the largest peak memory of a panel
REFERENCE_COLORS = ("black", "dimgray", "darkred", "darkblue", "darkgreen", "purple", "saddlebrown", "olive")


def save(fig, out: Path) -> Path:
    """Lay out, write ``fig`` to ``out`` (parents created) and close it."""
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")  # legends sit outside the axes
    plt.close(fig)
    return out


def plot_accuracy_vs_throughput(summary: list[dict], out: Path) -> Path:
    """Draw the rows of ``summary`` (``lra.analysis.report.summarize``) that have accuracy and throughput into ``out``."""
    points = [s for s in summary if s["test_acc_mean"] is not None and s["samples_per_s"] is not None]
    if not points:
        raise ValueError("nothing to plot: no row has a completed run with test_acc and samples_per_s")
    tasks = sorted({s["task"] for s in points})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        rows = [s for s in points if s["task"] == task]
        largest = max((s["peak_mem_mib"] or 0.0) for s in rows) or 1.0
        for s in rows:
            label = short_label(s["label"])
            area = MAX_MARKER_AREA * (s["peak_mem_mib"] or 0.0) / largest
            ax.scatter(s["samples_per_s"], s["test_acc_mean"], s=max(area, 20.0), alpha=0.6, label=label)
            ax.annotate(f"{s['peak_mem_mib']:.0f} MiB" if s["peak_mem_mib"] else "", (s["samples_per_s"], s["test_acc_mean"]),
                        fontsize=7, ha="center", va="center")
        ax.set(title=task, xlabel="training throughput (samples/s)", ylabel="test accuracy (%)")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return save(fig, out)


def short_label(text: str) -> str:
    """A legend entry names settings, not folders: ``key=/a/b/listops_full`` -> ``key=listops_full``."""
    return " ".join(f"{word.split('=', 1)[0]}={Path(word.split('=', 1)[1]).name}" if "=" in word and "/" in
                    word.split("=", 1)[1] else word for word in text.split(" "))


def curve_label(run: dict, settings: dict[str, str]) -> str:
    """Legend entry of one run: attention, seed, the table's splitting ``settings`` of this run, test accuracy."""
    test = f", test {100 * run['test_acc']:.2f}%" if run.get("test_acc") is not None else ""
    chosen = "".join(f" {key}={value}" for key, value in settings.items() if value != "-")
    return short_label(f"{run['attention']} s{run['seed']}{chosen}{test}")


def plot_learning_curves(runs: list[dict], out: Path, settings: list[dict[str, str]] | None = None,
                         references: dict[str, dict[str, float]] | None = None) -> Path:
    """Validation accuracy (%) vs optimizer step, one line per run with a ``val_curve``; one panel per task.

    ``settings[i]``: the override values that tell run ``i`` apart in the report's table (``lra.analysis.report.group_runs``),
    shown in its legend entry. ``references[task]``: ``{name: accuracy %}`` drawn as dashed horizontal lines
    (chance, the shortcut, published numbers). Legends sit outside the axes, clear of the data.
    """
    settings = settings or [{} for _ in runs]
    references = references or {}
    labels = {id(run): curve_label(run, chosen) for run, chosen in zip(runs, settings)}
    curves = [run for run in runs if run.get("val_curve")]
    if not curves:
        raise ValueError("nothing to plot: no run has a val_curve (results.json written before val_curve existed?)")
    tasks = sorted({str(run["task"]) for run in curves})
    fig, axes = plt.subplots(len(tasks), 1, figsize=(11, 4.5 * len(tasks)), squeeze=False)
    for ax, task in zip(axes[:, 0], tasks):
        for run in (run for run in curves if str(run["task"]) == task):
            steps, accuracy = zip(*run["val_curve"])
            ax.plot(steps, [100 * a for a in accuracy], marker=".", label=labels[id(run)])
        for (name, level), color in zip(sorted(references.get(task, {}).items()), REFERENCE_COLORS):
            ax.axhline(level, color=color, linestyle="--", linewidth=1, label=f"{name}: {level:.2f}%")
        ax.set(title=task, xlabel="step", ylabel="validation accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return save(fig, out)
