"""Benchmarks (``python -m lra.bench attention|train``): counters checked by hand, tiny end-to-end runs whose
ratios are recomputed from the CSV against the softmax row of the same run."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from lra import REPO_ROOT
from lra.bench import common, counters
from lra.bench.__main__ import main


@pytest.fixture(autouse=True)
def keep_thread_count():
    """``--threads`` sets torch's thread count for the process: restore it for the tests that follow."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def read_csv(path: Path) -> list[dict]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def number(value: str) -> float:
    return float(value)


def test_saved_bytes_counts_each_saved_storage_once():
    x = torch.randn(3, 5, requires_grad=True)
    w = torch.randn(5, 7, requires_grad=True)
    with counters.SavedTensorBytes() as saved:
        x @ w  # mm saves both operands: (3*5 + 5*7) float32 values
    assert saved.bytes == (3 * 5 + 5 * 7) * 4
    with counters.SavedTensorBytes(exclude=[w]) as saved:
        x @ w
    assert saved.bytes == 3 * 5 * 4
    with counters.SavedTensorBytes() as saved:
        x * x  # x saved twice by one op, a view of x by another: one storage
        x[:2].exp()
    exp_output = 2 * 5 * 4  # exp saves its (new) output
    assert saved.bytes == 3 * 5 * 4 + exp_output
    with counters.SavedTensorBytes() as saved, torch.no_grad():
        x @ w
    assert saved.bytes == 0


def test_flop_counter_matmul_and_cpu_sdpa():
    m, k, n = 6, 10, 4
    a, b = torch.randn(m, k), torch.randn(k, n)
    assert counters.count_flops(lambda: a @ b) == 2 * m * n * k
    batch, heads, length, dim = 2, 3, 16, 8
    q = torch.randn(batch, heads, length, dim)
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    flops = counters.count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask))
    assert flops == batch * heads * (2 * length * length * dim) * 2  # Q Kᵀ and A V
    c, x, y = torch.randn(5, 6, 4), torch.randn(5, 6, 10), torch.randn(5, 10, 4)
    assert counters.count_flops(lambda: c.baddbmm_(x, y, alpha=-1)) == counters.count_flops(lambda: torch.bmm(x, y))
    assert counters.count_flops(lambda: c.baddbmm_(x, y)) == 2 * 5 * 6 * 10 * 4  # in place, as pinv's backward


def test_variants_are_discovered_from_configs():
    on_disk = sorted(path.stem for path in (REPO_ROOT / "configs" / "attention").glob("*.yaml"))
    variants = common.select_variants(None, ["liza:base_window=8,dropout=0.0", "curformer:num_landmarks=8"])
    labels = [v.label for v in variants]
    assert labels[:2] == ["softmax", "softmax_materialised"]
    assert sorted(labels[: len(on_disk)]) == on_disk
    assert labels[len(on_disk):] == ["liza[base_window=8,dropout=0.0]", "curformer[num_landmarks=8]"]
    assert variants[-2].config_overrides() == ["attention=liza", "attention.base_window=8", "attention.dropout=0.0"]
    narrowed = common.select_variants(["curformer"], ["liza:base_window=8"])
    assert [v.label for v in narrowed] == ["softmax", "softmax_materialised", "curformer"]
    with pytest.raises(ValueError, match="not found"):
        common.select_variants(["no_such_attention"], [])
    with pytest.raises(ValueError, match="name:key=value"):
        common.select_variants(None, ["liza"])


def test_bench_attention_tiny(tmp_path):
    out = tmp_path / "attention"
    main(["attention", "--n", "32", "64", "--batch", "1", "--warmup", "0", "--repeats", "1", "--device", "cpu",
          "--threads", "1",
          "--variants", "curformer", "mega", "flashcur", "--variant-overrides", "curformer:num_landmarks=8",
          "--out", str(out)])
    assert (out / "attention.png").stat().st_size > 0
    rows = read_csv(out / "attention.csv")
    assert list(rows[0]) == [
        "level", "variant", "n", "batch", "heads", "head_dim", "device", "dtype", "threads", "status", "reason",
        "fwd_s", "fwdbwd_s", "speedup_fwd", "speedup_fwdbwd", "speedup_fwd_materialised",
        "speedup_fwdbwd_materialised", "flops_fwd", "flops_fwdbwd", "flops_per_s_fwd", "flops_per_s_fwdbwd",
        "flop_ratio_fwd", "flop_ratio_fwdbwd", "matmul_flops_per_s",
        "saved_bytes", "saved_ratio", "peak_mem_bytes", "mem_ratio", "fwdbwd_graph_s", "speedup_fwdbwd_graph",
        "graph_reason", "cpu", "cpu_capability", "torch", "gpu", "gpu_capability", "impl",
    ]
    assert {r["impl"] for r in rows} == {"auto"}  # the attention.impl each row ran (none overridden here)
    # where the figures came from: every row names the CPU, ATen's SIMD level, the threads and the torch version
    assert {(r["cpu"], r["cpu_capability"], r["torch"]) for r in rows} == {
        (common.cpu_model(), torch.backends.cpu.get_cpu_capability(), torch.__version__)}
    assert rows[0]["cpu"] and rows[0]["gpu"] == rows[0]["gpu_capability"] == ""  # CPU run: no GPU
    by_key = {(r["n"], r["level"], r["variant"]): r for r in rows}
    expected_ok = [("core", "softmax"), ("layer", "softmax"), ("core", "curformer"), ("layer", "mega"),
                   ("core", "curformer[num_landmarks=8]"), ("core", "softmax_materialised")]
    for n in ("32", "64"):
        for level, variant in expected_ok:
            assert by_key[(n, level, variant)]["status"] == "ok", (n, level, variant)
        assert by_key[(n, "core", "flashcur")]["status"] == "skipped"
        assert "CUDA" in by_key[(n, "core", "flashcur")]["reason"]
        assert by_key[(n, "core", "sdpa_flash")]["status"] == "skipped"
        for level, variant in expected_ok:
            row = by_key[(n, level, variant)]
            ref = by_key[(n, level, "softmax")]
            assert number(row["speedup_fwd"]) == pytest.approx(number(ref["fwd_s"]) / number(row["fwd_s"]))
            assert number(row["speedup_fwdbwd"]) == pytest.approx(number(ref["fwdbwd_s"]) / number(row["fwdbwd_s"]))
            assert number(row["flops_fwdbwd"]) > number(row["flops_fwd"]) > 0
            for phase, seconds in (("fwd", "fwd_s"), ("fwdbwd", "fwdbwd_s")):  # how far from the machine's limit
                flops = number(row[f"flops_{phase}"])
                assert number(row[f"flops_per_s_{phase}"]) == pytest.approx(flops / number(row[seconds]))
                assert number(row[f"flop_ratio_{phase}"]) == pytest.approx(number(ref[f"flops_{phase}"]) / flops)
            assert number(row["matmul_flops_per_s"]) > 0
            assert row["peak_mem_bytes"] == ""  # CUDA only
            assert row["fwdbwd_graph_s"] == "" and row["graph_reason"] == "CUDA graphs need a GPU"
            if level == "core":
                materialised = number(by_key[(n, "core", "softmax_materialised")]["saved_bytes"])
                assert number(row["saved_ratio"]) == pytest.approx(number(row["saved_bytes"]) / materialised)
                mat_fwd = number(by_key[(n, "core", "softmax_materialised")]["fwd_s"])
                assert number(row["speedup_fwd_materialised"]) == pytest.approx(mat_fwd / number(row["fwd_s"]))
            else:
                assert row["saved_ratio"] == row["speedup_fwd_materialised"] == ""
    # The materialised reference saves q, k, v and the (B, H, n, n) probabilities (mask and scalar ops save no more).
    batch, heads, head_dim, n = 1, 2, 32, 64
    qkv = 3 * batch * heads * n * head_dim * 4
    assert number(by_key[("64", "core", "softmax_materialised")]["saved_bytes"]) >= qkv + batch * heads * n * n * 4
    # m = 8 landmarks keep the saved activations below those of m = 64 (all 64 tokens selected).
    assert number(by_key[("64", "core", "curformer[num_landmarks=8]")]["saved_bytes"]) < number(
        by_key[("64", "core", "curformer")]["saved_bytes"])
    assert by_key[("64", "layer", "mega")]["heads"] == "1"
    assert {r["threads"] for r in rows} == {"1"}


def test_bench_attention_layer_level(tmp_path):
    """--level layer: every variant as a one-layer model, ratios against the layer-level softmax, no core rows."""
    out = tmp_path / "layer"
    main(["attention", "--level", "layer", "--n", "32", "--batch", "1", "--warmup", "0", "--repeats", "1",
          "--device", "cpu", "--variants", "nystromformer", "--variant-overrides", "--out", str(out)])
    rows = read_csv(out / "attention.csv")
    assert [(r["level"], r["variant"], r["status"]) for r in rows] == [
        ("layer", "softmax", "ok"), ("layer", "softmax_materialised", "ok"), ("layer", "nystromformer", "ok")]
    softmax, _, nystrom = rows
    assert number(nystrom["speedup_fwdbwd"]) == pytest.approx(number(softmax["fwdbwd_s"]) / number(nystrom["fwdbwd_s"]))
    assert nystrom["heads"] == "2"


@pytest.mark.process  # a worker process per variant (lra.bench.train.run_worker)
def test_bench_train_tiny(tmp_path):
    out = tmp_path / "train"
    main(["train", "--task", "text", "--n", "256", "--batch", "2", "--steps", "2", "--warmup", "0", "--device", "cpu",
          "--threads", "1",
          "--variants", "curformer", "--variant-overrides", "--out", str(out)])
    assert (out / "train.png").stat().st_size > 0
    rows = read_csv(out / "train.csv")
    assert [r["variant"] for r in rows] == ["softmax", "softmax_materialised", "curformer"]
    assert {r["status"] for r in rows} == {"ok"}
    softmax, transformer = rows[0], rows[1]
    for row in rows:
        assert number(row["speed_ratio"]) == pytest.approx(
            number(row["train_samples_per_s"]) / number(softmax["train_samples_per_s"]))
        assert number(row["speed_vs_transformer"]) == pytest.approx(
            number(row["train_samples_per_s"]) / number(transformer["train_samples_per_s"]))
        assert number(row["mem_vs_transformer"]) == pytest.approx(
            number(row["peak_mem_bytes"]) / number(transformer["peak_mem_bytes"]))
        assert number(row["mem_ratio"]) == pytest.approx(number(row["peak_mem_bytes"]) / number(softmax["peak_mem_bytes"]))
        assert number(row["infer_ratio"]) == pytest.approx(
            number(row["infer_samples_per_s"]) / number(softmax["infer_samples_per_s"]))
        assert number(row["rss_ratio"]) == pytest.approx(number(row["rss_delta_bytes"]) / number(softmax["rss_delta_bytes"]))
        assert number(row["train_samples_per_s"]) == pytest.approx(2 / number(row["train_step_s"]))
        # CPU peak memory = saved-for-backward + params, grads and AdamW's two moments (4 x params in float32).
        assert number(row["state_bytes"]) >= 4 * 4 * number(row["params"])
        assert number(row["peak_mem_bytes"]) == number(row["saved_bytes"]) + number(row["state_bytes"])
        assert number(row["rss_peak_bytes"]) >= number(row["rss_delta_bytes"]) > 0
        # FLOP/s of the timed steps from the FLOPs of one step, beside what a matrix product reaches here
        assert number(row["train_flops"]) > 0 and row["compiled"] == "False" and row["compile_speedup"] == ""
        assert number(row["train_flops_per_s"]) == pytest.approx(number(row["train_flops"]) / number(row["train_step_s"]))
        assert number(row["flops_utilisation"]) == pytest.approx(
            number(row["train_flops_per_s"]) / number(row["matmul_flops_per_s"]))
    assert rows[0]["matmul_flops_per_s"] == rows[2]["matmul_flops_per_s"]
    assert number(rows[2]["train_flops"]) != number(softmax["train_flops"])
    assert softmax["speed_ratio"] == softmax["mem_ratio"] == "1.0"
    assert {r["threads"] for r in rows} == {"1"}
    assert {(r["cpu"], r["cpu_capability"], r["torch"]) for r in rows} == {
        (common.cpu_model(), torch.backends.cpu.get_cpu_capability(), torch.__version__)}


def test_machine_line_names_cpu_simd_threads_torch_and_gpu():
    where = {"cpu": "AMD EPYC 7B13", "cpu_capability": "AVX2", "threads": 2, "torch": "2.13.0+cpu",
             "gpu": None, "gpu_capability": None}
    assert common.machine_line(where) == "AMD EPYC 7B13, ATen AVX2, 2 threads, torch 2.13.0+cpu"
    where.update(gpu="NVIDIA H100 80GB HBM3", gpu_capability="9.0")
    assert common.machine_line(where).endswith("; GPU NVIDIA H100 80GB HBM3 (sm 9.0)")
    assert common.machine(torch.device("cpu"))["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


@pytest.mark.slow
def test_bench_train_compile(tmp_path):
    """--compile: each variant eager and compiled, the compiled row's speed-up over its own eager row."""
    out = tmp_path / "compiled"
    main(["train", "--task", "listops", "--n", "64", "--batch", "2", "--steps", "1", "--warmup", "0", "--device", "cpu",
          "--threads", "1", "--variants", "curformer", "--variant-overrides", "--compile", "--out", str(out)])
    rows = {r["variant"]: r for r in read_csv(out / "train.csv")}
    assert list(rows) == ["softmax", "softmax+compile", "softmax_materialised", "softmax_materialised+compile",
                          "curformer", "curformer+compile"]
    assert {r["status"] for r in rows.values()} == {"ok"}
    for name in ("softmax", "curformer"):
        eager, compiled = rows[name], rows[name + "+compile"]
        assert (eager["compiled"], compiled["compiled"]) == ("False", "True")
        assert number(compiled["compile_speedup"]) == pytest.approx(
            number(compiled["train_samples_per_s"]) / number(eager["train_samples_per_s"]))
        assert number(compiled["train_flops"]) == number(eager["train_flops"])  # counted on the eager model
        # compiled rows against the compiled references
        assert number(compiled["speed_ratio"]) == pytest.approx(
            number(compiled["train_samples_per_s"]) / number(rows["softmax+compile"]["train_samples_per_s"]))
        assert number(compiled["speed_vs_transformer"]) == pytest.approx(
            number(compiled["train_samples_per_s"]) / number(rows["softmax_materialised+compile"]["train_samples_per_s"]))


@pytest.mark.slow
def test_bench_train_two_document_task(tmp_path):
    """Retrieval's pair head gets (B, 2, n) ids; FlashCUR without CUDA is a skipped row with the reason."""
    out = tmp_path / "retrieval"
    main(["train", "--task", "retrieval", "--n", "64", "--batch", "2", "--steps", "1", "--warmup", "0",
          "--device", "cpu", "--variants", "flashcur", "--variant-overrides", "--out", str(out)])
    rows = {r["variant"]: r for r in read_csv(out / "train.csv")}
    assert rows["softmax"]["status"] == "ok"
    if not torch.cuda.is_available():
        assert rows["flashcur"]["status"] == "skipped" and "CUDA" in rows["flashcur"]["reason"]


def test_bench_profile_prints_forward_and_backward_operators(capsys):
    """``python -m lra.bench profile``: the variant's forward and backward, each with its time, FLOPs and top
    operators (the CUR forward's landmark products, kernels.landmark_attention's kernels on CPU, and
    pseudo-inverse matmuls among them; in the backward CUR's one node, kernels.cur.cpu, whose kernels replace
    SDPA's backward); one thread by default."""
    torch.set_num_threads(2)
    main(["profile", "--variant", "curformer", "--overrides", "num_landmarks=8", "--n", "32", "--batch", "1",
          "--warmup", "0", "--repeats", "1", "--top", "40", "--device", "cpu", "--softmax"])
    out = capsys.readouterr().out
    assert torch.get_num_threads() == 1 and "1 thread" in out
    phases = [line for line in out.splitlines() if line.startswith("core/")]
    assert [line.split(" n=32 ")[0] + " " + line.split(" n=32 ")[1].split(":")[0] for line in phases] == [
        "core/softmax forward", "core/softmax backward", "core/curformer[num_landmarks=8] forward",
        "core/curformer[num_landmarks=8] backward"]
    assert all("GFLOP/s" in line for line in phases)
    forward, backward = out.split("core/curformer[num_landmarks=8] n=32 forward")[1].split("backward:")
    assert "aten::bmm" in forward and "LandmarkAttention" in forward
    assert "CURKernelAttentionBackward" in backward
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" not in backward
    with pytest.raises(ValueError, match="not found"):
        main(["profile", "--variant", "no_such_attention", "--device", "cpu"])


def test_default_output_folder_is_a_fresh_folder_under_outputs_bench():
    """Without ``--out`` the benchmarks write to ``outputs/bench/<timestamp>/`` in the checkout, a new one per call."""
    first, second = common.default_out_dir(), common.default_out_dir()
    assert first.parent == second.parent == REPO_ROOT / "outputs" / "bench"
    assert first != second


@pytest.mark.parametrize("task, expected", [("listops", ()), ("retrieval", (2,))])
def test_bench_train_probes_the_head_on_the_model_device(task, expected):
    """The worker's one-document/pair probe runs where the model lives (a CPU probe of a CUDA model failed every
    variant of `lra.bench train --device cuda`); the meta device stands in for CUDA here."""
    from lra.bench.train_worker import documents_shape
    from lra.config import compose_config
    from lra.build import build_model

    model = build_model(compose_config([f"task={task}", "attention=softmax"])).to("meta")
    assert documents_shape(model) == expected


def test_launch_counter_counts_kernels_not_views_and_fused_attention_as_cuda_runs_it():
    """:class:`lra.bench.launches.LaunchCounter`: views and allocations launch nothing; a product and a sum launch
    one kernel each; ``F.scaled_dot_product_attention`` with a boolean mask as CUDA runs it: the mask turned into
    an additive one and the memory-efficient kernel forward, its backward one kernel."""
    from lra.bench.launches import CudaAttention, LaunchCounter

    x, y = (torch.empty(4, 6, device="meta", requires_grad=True) for _ in range(2))
    with LaunchCounter() as counter:
        (x.t().reshape(6, 4)[:3] @ y.view(4, 6)).sum()
    assert counter.counts["forward"] == 2 and set(counter.ops) == {"mm", "sum"}
    q = torch.empty(2, 3, 64, 16, device="meta", requires_grad=True)
    mask = torch.ones(2, 1, 1, 64, dtype=torch.bool, device="meta")
    with LaunchCounter() as counter, CudaAttention():
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        counter.phase = "backward"
        torch.autograd.grad(out, q, torch.empty_like(out))
    assert (counter.counts["forward"], counter.counts["backward"]) == (2, 1 + 2)  # the kernel, q's 3 gradients summed
    assert counter.ops["_scaled_dot_product_efficient_attention_backward"] == 1


def test_bench_launches_of_the_landmark_variants(tmp_path):
    """``python -m lra.bench launches`` at the issue's shape (n = 4096, B 8, H 2, d 32, m 64), float32: SDPA softmax
    is its mask conversion and one kernel each way; the pseudo-inverse of CURformer, FlashCUR and Nyströmformer is its
    fused operator (one launch each way). Pinned counts (code of 967bbeb), so that a change that adds launches is
    seen: FlashCUR 36 (its Triton kernels split over n, a merge of the splits), CURformer 87 and Nyströmformer 78 (the
    sequence-sized stages as batched GEMMs with their masks, softmaxes and split-K sums, weights recomputed in the
    backward: about twice the 30 of their attention-kernel forms, which ran on B·H programs; since 967bbeb in the
    chunked layout that takes any n, 6 more: a per-chunk copy of 4 m-sized operands, the merges of the per-chunk
    column max and sum; ``lra.bench plan`` is the measure of where they run)."""
    out = tmp_path / "launches"
    main(["launches", "--variants", "curformer", "flashcur", "nystromformer", "--variant-overrides", "--out", str(out)])
    rows = {r["variant"]: r for r in read_csv(out / "launches.csv")}
    assert {"softmax", "curformer", "flashcur", "nystromformer"} <= set(rows)
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert {(r["n"], r["batch"], r["heads"], r["head_dim"]) for r in rows.values()} == {("4096", "8", "2", "32")}
    softmax = rows["softmax"]
    assert int(softmax["launches"]) <= 3 and softmax["pinv"] == "0"
    limits = {"curformer": 87, "flashcur": 36, "nystromformer": 78}
    for name, limit in limits.items():
        row = rows[name]
        assert row["landmarks"] == "64"
        assert int(row["forward"]) + int(row["backward"]) == int(row["launches"])
        assert int(softmax["launches"]) < int(row["launches"]) <= limit, row
        assert "lra_pinv::forward:1" in row["ops"] and "lra_pinv::backward:1" in row["ops"], row["ops"]
        assert int(row["pinv"]) == 2, row  # the fused kernel forward and backward, nothing around them


def test_bf16_runs_feed_the_attention_core_bf16_inputs():
    """``--dtype bf16``: the core rows get bf16 ``q, k, v`` (what the bf16 model's projections give attention under
    autocast), fp32 runs float32; the layer rows take token ids either way."""
    from lra.bench.cases import build_cases

    variants = common.select_variants(["curformer"], [])
    for dtype in (torch.bfloat16, torch.float32):
        cases, _ = build_cases(variants, "auto", 32, 2, 2, 16, torch.device("cpu"), dtype)
        for case in cases:
            q, k, v, mask = case.make_inputs(32)
            assert {q.dtype, k.dtype, v.dtype} == {dtype} and q.requires_grad and mask.dtype == torch.bool


def test_profile_kernel_rows_from_the_trace_events():
    """``lra.bench profile --device cuda`` reads the chrome trace's GPU events: per kernel its time per profiled call,
    share, launches per call, programs (grid x·y·z; a range where launches differ) and threads per program; copies
    have no grid. A CPU profile has no GPU events."""
    from torch.profiler import ProfilerActivity, profile

    from lra.bench.profile import device_events, kernel_rows

    events = [
        {"ph": "X", "cat": "kernel", "name": "_rv_fwd", "dur": 30.0, "args": {"grid": [16, 1, 1], "block": [128, 1, 1]}},
        {"ph": "X", "cat": "kernel", "name": "_rv_fwd", "dur": 50.0, "args": {"grid": [4, 66, 1], "block": [128, 1, 1]}},
        {"ph": "X", "cat": "kernel", "name": "flash_fwd", "dur": 100.0, "args": {"grid": [8, 2, 16], "block": [64, 2, 1]}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "dur": 20.0, "args": {}},
    ]
    rows = kernel_rows(events, calls=2)
    assert [row["op"] for row in rows] == ["flash_fwd", "_rv_fwd", "Memset (Device)"]
    flash, rv, memset = rows
    assert flash == {"op": "flash_fwd", "ms": 0.05, "share": 0.5, "calls": 0.5, "programs": "256", "threads": "128"}
    assert rv["ms"] == pytest.approx(0.04) and rv["calls"] == 1 and rv["programs"] == "16–264"
    assert (memset["programs"], memset["threads"]) == ("-", "-")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(4) @ torch.ones(4)
    assert device_events(prof) == []


def test_train_worker_peak_window_on_cpu():
    """``timed_steps``: the median of the timed steps after the warm-up ones (the CUDA peak, reset before the
    warm-up so that a compiled model's CUDA-graph recording is inside it, is None on CPU)."""
    from lra.bench.train_worker import timed_steps

    calls = []
    step_s, peak = timed_steps(lambda: calls.append(1), torch.device("cpu"), warmup=2, steps=3)
    assert len(calls) == 5 and peak is None and step_s >= 0


def test_flop_counter_sees_custom_ops_with_a_registered_formula():
    """The benchmarks' FLOP column (``counters.count_flops``) counts a ``torch.library.custom_op`` (the Triton kernels'
    form) once its formula is registered with ``register_flop_formula``: ``FlopCounterMode`` reads the registry when
    it is created, after the kernels' modules registered theirs; without a formula the op counts 0."""
    from torch.utils.flop_counter import register_flop_formula

    @torch.library.custom_op("lra_bench_test::scaled_mm", mutates_args=())
    def scaled_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return 2 * a @ b

    @torch.library.custom_op("lra_bench_test::no_formula", mutates_args=())
    def no_formula(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    @register_flop_formula(torch.ops.lra_bench_test.scaled_mm)
    def scaled_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]

    a, b = torch.randn(4, 5), torch.randn(5, 3)
    assert counters.count_flops(lambda: scaled_mm(a, b)) == 2 * 4 * 5 * 3
    assert counters.count_flops(lambda: no_formula(a, b)) == 0


def test_bench_rows_on_cpu(tmp_path):
    """``python -m lra.bench rows``: the split-K stage timed, with its errors against float64 dense softmax within
    float32's; kernel (a) skipped off CUDA with the reason; the launches of both counted on ``meta`` (kernel (a)'s
    custom ops once each: fewer than the split-K stage's GEMMs, masks and reductions)."""
    main(["rows", "--device", "cpu", "--n", "97", "--batch", "2", "--heads", "2", "--head-dim", "16", "--landmarks",
          "20", "--warmup", "0", "--repeats", "1", "--threads", "1", "--out", str(tmp_path)])
    with (tmp_path / "rows.csv").open() as handle:
        rows = {row["form"]: row for row in csv.DictReader(handle)}
    kernel, split_k = rows["triton"], rows["fused"]
    assert (kernel["status"], kernel["reason"]) == ("skipped", "kernel (a) needs a CUDA device")
    assert split_k["status"] == "ok" and float(split_k["fwd_s"]) > 0 and float(split_k["fwdbwd_s"]) > 0
    assert 0 < float(split_k["error_fwd"]) < 1e-5 and 0 < float(split_k["error_grad"]) < 1e-5
    assert int(kernel["launches_fwdbwd"]) < int(split_k["launches_fwd"]) < int(split_k["launches_fwdbwd"])
