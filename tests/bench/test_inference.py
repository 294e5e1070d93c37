"""``python -m lra.bench train --inference`` (Proxyformer Table 2): the CPU memory counter checked by hand, the
inference worker in process at two lengths, and one tiny end-to-end run whose ratios are recomputed from the CSV."""

from __future__ import annotations

import csv

import pytest
import torch

from lra.bench import common, inference
from lra.bench.__main__ import main
from lra.build import build_model
from lra.config import compose_config

MIB = 2**20


@pytest.fixture(autouse=True)
def keep_thread_count():
    """``--threads`` / the worker's ``setup_process`` set torch's thread count for the process: restore it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_cpu_peak_bytes_is_the_peak_of_live_tensor_memory():
    """1 MiB and 2 MiB live, the 1 MiB freed, 3 MiB allocated: the peak is 2 + 3 = 5 MiB, not the 6 MiB allocated."""
    kept = torch.zeros(MIB, dtype=torch.uint8)  # allocated before: not counted

    def fn():
        a = torch.ones(MIB, dtype=torch.uint8)
        b = torch.ones(2 * MIB, dtype=torch.uint8)
        del a
        c = torch.ones(3 * MIB, dtype=torch.uint8)
        return b, c

    assert inference.cpu_peak_bytes(fn) == 5 * MIB
    assert kept.numel() == MIB


def spec(variant: str, n: int) -> dict:
    overrides = ["task=text", f"task.max_length={n}", f"attention={variant}", "model.num_layers=6"]
    return {"overrides": overrides, "n": n, "batch": 2, "steps": 1, "warmup": 0, "device": "cpu", "dtype": "fp32",
            "threads": 1}


def test_memory_per_sequence_grows_with_the_n_by_n_weights():
    """The materialised Transformer keeps (H, n, n) scores and weights per layer: from n 64 to 256 its memory per
    sequence grows more than the 4× of the linear terms; SDPA's (no n×n buffer on this path) less, and below it."""
    m = {(v, n): inference.measure(spec(v, n)) for v in (common.MATERIALISED, common.BASELINE) for n in (64, 256)}
    for result in m.values():
        assert result["layers"] == 6 and result["mem_per_seq_bytes"] == result["infer_peak_bytes"] / 2 > 0
        assert result["infer_samples_per_s"] == pytest.approx(2 / result["infer_step_s"])
    materialised = m[common.MATERIALISED, 256]["mem_per_seq_bytes"] / m[common.MATERIALISED, 64]["mem_per_seq_bytes"]
    sdpa = m[common.BASELINE, 256]["mem_per_seq_bytes"] / m[common.BASELINE, 64]["mem_per_seq_bytes"]
    assert materialised > 4 > sdpa * 0.9
    # two (H, n, n) float32 buffers alive at once (scores, weights) at n 256, H 2: 1 MiB per sequence at least
    assert m[common.MATERIALISED, 256]["mem_per_seq_bytes"] >= 2 * 2 * 256 * 256 * 4
    assert m[common.MATERIALISED, 256]["mem_per_seq_bytes"] > m[common.BASELINE, 256]["mem_per_seq_bytes"]


def params_of(layers: int, n: int, ffn_dim: int) -> int:
    cfg = compose_config(["task=text", f"task.max_length={n}", f"attention={common.MATERIALISED}",
                          f"model.num_layers={layers}", f"model.ffn_dim={ffn_dim}"])
    return sum(p.numel() for p in build_model(cfg).parameters())


def test_bench_train_inference_tiny(tmp_path, capsys):
    """The CLI end to end (worker processes): 6 layers, ``--overrides`` reaching the model, ratios × the
    Transformer, the paper's table."""
    out = tmp_path / "inference"
    main(["train", "--inference", "--task", "text", "--n", "64", "--batch", "2", "--steps", "1", "--warmup", "0",
          "--device", "cpu", "--threads", "1", "--variants", common.MATERIALISED, "--variant-overrides",
          "--overrides", "model.ffn_dim=96", "--out", str(out)])
    printed = capsys.readouterr().out
    with (out / "inference.csv").open() as handle:
        rows = {row["variant"]: row for row in csv.DictReader(handle)}
    assert list(rows) == [common.BASELINE, common.MATERIALISED] and {r["status"] for r in rows.values()} == {"ok"}
    transformer = rows[common.MATERIALISED]
    for row in rows.values():
        assert row["layers"] == "6" and int(row["params"]) == params_of(6, 64, 96) > params_of(2, 64, 96)
        assert params_of(6, 64, 96) != params_of(6, 64, 128)  # the config's FFN width would give other counts
        assert float(row["mem_vs_transformer"]) == pytest.approx(
            float(row["mem_per_seq_bytes"]) / float(transformer["mem_per_seq_bytes"]))
        assert float(row["tp_vs_transformer"]) == pytest.approx(
            float(row["infer_samples_per_s"]) / float(transformer["infer_samples_per_s"]))
        assert float(row["rss_infer_bytes"]) > 0
    sdpa = rows[common.BASELINE]
    mib = float(transformer["mem_per_seq_bytes"]) / MIB
    assert f"1 ({mib:.1f} MiB)" in printed and f"1 ({float(transformer['infer_samples_per_s']):.3g})" in printed
    assert f"{float(sdpa['mem_vs_transformer']):.2f}" in printed.split(f"\n{common.BASELINE} ")[1].split("\n")[0]


@pytest.mark.parametrize("flags, message", [
    (["--inference", "--compile"], "--compile with --inference"),
    (["--inference", "--layers", "0"], "--layers must be >= 1"),
    (["--experiment", "proxyformer_tabel1"], "--experiment proxyformer_tabel1: no configs/experiment/"),
    (["--overrides", "model.num_layer=6"], "model.num_layer=6 does not compose"),
])
def test_bad_flags_are_refused_before_anything_is_written(tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        main(["train", *flags, "--device", "cpu", "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()
