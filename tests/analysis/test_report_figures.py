"""The report's figures on hand-made runs: one colour per attention, one line style per setting or seed, each
reference line once, nothing outside the axes, PNG and PDF."""

from __future__ import annotations

import json

import yaml
from matplotlib.colors import to_hex

from lra.analysis import report
from lra.analysis.report_plot import draw_accuracy_vs_throughput, draw_learning_curves

from test_report import write_run


def recorded_runs(root):
    curve = lambda top: [[250, 0.17], [500, top]]  # noqa: E731
    config = {"task": {"name": "listops", "num_classes": 10}, "trainer": {"accelerator": "cpu"}}
    extra = {"shortcut": "first-operator cue", "shortcut_val_acc": 0.3675, "shortcut_test_acc": 0.3385}
    for name, attention, seed, overrides, top in (
            ("c0", "curformer", 0, [], 0.36), ("c1", "curformer", 1, [], 0.35),
            ("sum", "curformer", 0, ["attention.selection=sum"], 0.34), ("embed", "curformer", 0, ["attention.selection=embed"], 0.33),
            ("n0", "nystromformer", 0, [], 0.20), ("gpu", "nystromformer", 0, ["trainer=gpu"], 0.30)):
        gpu = {"trainer": {"accelerator": "gpu"}} if "trainer=gpu" in overrides else {}
        selection = overrides[0].split("=")[1] if overrides and "selection" in overrides[0] else "abs"
        write_run(root, name, "listops", attention, seed, top, overrides=overrides,
                  config={**config, **gpu, "attention": {"name": attention, "selection": selection}},
                  val_curve=curve(top), **extra)
    rows = report.group_runs(report.collect([root]))[0]
    return rows, report.summarize(rows, yaml.safe_load(report.PUBLISHED.read_text()))


def test_curves_one_colour_per_attention_one_style_per_run_references_once(tmp_path):
    rows, summary = recorded_runs(tmp_path)
    (ax,) = draw_learning_curves(rows, summary).axes[:1]
    runs = [line for line in ax.get_lines() if " · seed " in line.get_label()]
    assert len(runs) == 6
    colour = {}
    for line in runs:
        colour.setdefault(line.get_label().split(" · ")[0], set()).add(to_hex(line.get_color()))
    assert all(len(hexes) == 1 for hexes in colour.values()) and colour["curformer"] != colour["nystromformer"]
    styles = [(str(line.get_linestyle()), str(line.get_marker())) for line in runs if line.get_label().startswith("curformer")]
    assert len(set(styles)) == len(styles) == 4
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert [label for label in labels if label.startswith("chance")] == ["chance: 10.00"]
    assert [label for label in labels if label.startswith("cue")] == ["cue (val): 36.75"]
    published = [label for label in labels if label.startswith("published")]
    assert len(published) == len(set(published)) == 4  # 39.62 (Abs), 38.99 (Sum), 38.63 (Embed), 37.15 (Nyström)
    assert "published curformer: 39.62" in published


def test_speed_figure_has_every_point_inside_its_axes_and_a_panel_per_device(tmp_path):
    _, summary = recorded_runs(tmp_path)
    fig = draw_accuracy_vs_throughput(summary)
    titles = [ax.get_title() for ax in fig.axes]
    assert [title.split(":")[0] for title in titles] == ["listops on CPU", "listops on GPU"]
    cpu = fig.axes[0]
    (low_x, high_x), (low_y, high_y) = cpu.get_xlim(), cpu.get_ylim()
    for collection in cpu.collections:
        for x, y in collection.get_offsets():
            assert low_x < x < high_x and low_y < y < high_y
    references = {line.get_label().split(":")[0] for line in cpu.get_lines()}
    assert references == {"chance", "cue (first-operator cue)"} and low_y < 10 < high_y
    numbers = [text.get_text() for text in cpu.texts]
    assert sorted(numbers, key=int) == [str(i) for i in range(1, len(cpu.collections) + 1)]


def test_figures_are_written_as_png_and_pdf(tmp_path):
    recorded_runs(tmp_path / "runs")
    assert report.main([str(tmp_path / "runs"), "--out", str(tmp_path / "t.md"), "--plot", str(tmp_path / "speed.png"),
                        "--curves", str(tmp_path / "curves")]) == 0
    for name in ("speed", "curves"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
    old = tmp_path / "old"
    write_run(old, "s0", "listops", "curformer", 0, 0.3)
    try:
        report.main([str(old), "--out", str(tmp_path / "o.md"), "--curves", str(tmp_path / "none.png")])
    except ValueError as error:
        assert "no run has a val_curve" in str(error)
    else:
        raise AssertionError("curves without any val_curve must be refused")
    assert json.loads((old / "s0" / "results.json").read_text())["test_acc"] == 0.3
