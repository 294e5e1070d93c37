"""What both benchmarks share: variant discovery, config composition, timing, memory peaks, ratios against a
reference row, CSV/table writing (the deterministic counts, FLOPs and bytes saved for backward: lra.bench.counters).

Every variant is a file ``configs/attention/<name>.yaml``; nothing here lists names. A variant
may be benchmarked several times with extra overrides (``--variant-overrides liza:base_window=256``
adds the row ``liza[base_window=256]``).
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lra import REPO_ROOT
from lra.runtime.allocator import retain_freed_memory
from lra.config import CONFIG_DIR

ATTENTION_DIR = CONFIG_DIR / "attention"
BASELINE = "softmax"  # configs/attention/softmax.yaml: the SDPA Transformer every ratio is taken against
MATERIALISED = "softmax_materialised"  # the papers' "Transformer" row (n×n weights stored), the second reference
REFERENCES = (BASELINE, MATERIALISED)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Variant:
    """One benchmarked row: the attention config ``name`` plus ``overrides`` of its own keys."""

    name: str
    overrides: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        return f"{self.name}[{','.join(self.overrides)}]" if self.overrides else self.name

    def config_overrides(self) -> list[str]:
        """Hydra overrides selecting this variant (``attention=<name> attention.<key>=<value> ...``)."""
        return [f"attention={self.name}", *(f"attention.{item}" for item in self.overrides)]


def discover_variants() -> list[str]:
    """Names of every attention config in ``configs/attention/`` (sub-groups such as ``linear/`` excluded)."""
    names = sorted(path.stem for path in ATTENTION_DIR.glob("*.yaml"))
    for reference in REFERENCES:
        if reference not in names:
            raise FileNotFoundError(f"{ATTENTION_DIR / (reference + '.yaml')} is missing: the benchmarks compare against it")
    return names


def select_variants(requested: list[str] | None, override_specs: list[str]) -> list[Variant]:
    """The references first (SDPA softmax, then materialised softmax), then ``requested`` (default: every
    discovered variant), then override rows.

    ``override_specs`` items are ``name:key=value[,key=value]``; a spec whose variant is not selected
    adds nothing (so ``--variants`` can narrow a run without editing the overrides).
    """
    known = discover_variants()
    unknown = [name for name in requested or [] if name not in known]
    if unknown:
        raise ValueError(f"--variants {unknown} not found in {ATTENTION_DIR}; available: {known}")
    names = [*REFERENCES, *[name for name in (requested or known) if name not in REFERENCES]]
    variants = [Variant(name) for name in names]
    for spec in override_specs:
        name, sep, items = spec.partition(":")
        if not sep or not items or any("=" not in item for item in items.split(",")):
            raise ValueError(f"--variant-overrides {spec!r}: expected name:key=value[,key=value], e.g. liza:base_window=256")
        if name not in known:
            raise ValueError(f"--variant-overrides {spec!r}: no configs/attention/{name}.yaml; available: {known}")
        if name in names:
            variants.append(Variant(name, tuple(items.split(","))))
    return variants


def resolve_device(name: str | None) -> torch.device:
    """``--device``: default CUDA when available, else CPU; asking for CUDA without one is an error."""
    device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible to torch; use --device cpu")
    return device


def setup_process(threads: int | None) -> int:
    """``--threads``: ``torch.set_num_threads`` when given; returns the count in use (a CSV column). Also keeps freed
    memory in the process (:func:`lra.runtime.allocator.retain_freed_memory`): a benchmark repeats the same shapes."""
    retain_freed_memory()
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


MACHINE_COLUMNS = ["cpu", "cpu_capability", "threads", "torch", "gpu", "gpu_capability"]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform``), e.g. ``AMD EPYC 7B13``; a name
    without a model number (virtual machines report ``AMD EPYC``) gets the family and model: ``AMD EPYC
    (family 25, model 17)`` (Zen 4)."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                      if ":" in line)
    except OSError:
        fields = {}
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    if not any(char.isdigit() for char in name) and "cpu family" in fields:
        name += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    return name


def machine(device: torch.device) -> dict:
    """Where a figure was measured (a CSV column each, ``MACHINE_COLUMNS``): CPU model, the SIMD level ATen's
    kernels were dispatched to (``ATEN_CPU_CAPABILITY`` lowers it), torch's thread count and version, and on
    CUDA the GPU's name and compute capability. Call after :func:`setup_process`."""
    gpu = gpu_capability = None
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        gpu_capability = "{}.{}".format(*torch.cuda.get_device_capability(device))
    return {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "gpu": gpu, "gpu_capability": gpu_capability}


def machine_line(where: dict) -> str:
    """``machine()`` in one line, for plot titles, printed tables and docs/bench.md."""
    threads = f"{where['threads']} thread" + ("" if where["threads"] == 1 else "s")
    line = f"{where['cpu']}, ATen {where['cpu_capability']}, {threads}, torch {where['torch']}"
    return line + (f"; GPU {where['gpu']} (sm {where['gpu_capability']})" if where.get("gpu") else "")


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """Autocast to bf16 for ``--dtype bf16``; a no-op for fp32."""
    return torch.autocast(device.type, dtype=DTYPES[dtype], enabled=dtype != "fp32")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls after ``warmup`` untimed calls (CUDA synchronised)."""
    if repeats < 1:
        raise ValueError(f"--repeats/--steps must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_flops_per_s(device: torch.device, dtype: str, size: int = 2048, repeats: int = 3) -> float:
    """FLOP/s of a ``size`` × ``size`` matrix product on ``device`` in ``dtype`` at the current thread count
    (median of ``repeats`` after one warm-up): what this machine's GEMM reaches, the practical limit beside
    which a training step's FLOP/s shows how far the step is from it."""
    a, b = (torch.randn(size, size, device=device, dtype=DTYPES[dtype]) for _ in range(2))
    return 2 * size**3 / median_seconds(lambda: a @ b, device, 1, repeats)


def cuda_peak_bytes(fn: Callable[[], object], device: torch.device) -> int | None:
    """Peak CUDA memory allocated by ``fn()`` above what was allocated before; None on CPU."""
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - before)


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """``max |value − reference| / max |reference|`` (the plain largest difference where the reference is all 0)."""
    scale = reference.abs().max().item()
    return (value - reference).abs().max().item() / (scale if scale > 0 else 1.0)


def add_ratios(rows: list[dict], group_keys: tuple[str, ...], reference: Callable[[dict], bool],
               ratios: dict[str, tuple[str, bool]]) -> None:
    """Fill ``ratios`` columns in place against the reference row of the same group.

    ``ratios[column] = (metric, invert)``: ``row[column] = ref[metric] / row[metric]`` when ``invert``
    (speed-up from latencies), else ``row[metric] / ref[metric]``; None where either value is missing.
    """
    refs = {tuple(row[key] for key in group_keys): row for row in rows if reference(row)}
    for row in rows:
        ref = refs.get(tuple(row[key] for key in group_keys))
        for column, (metric, invert) in ratios.items():
            a, b = (ref or {}).get(metric), row.get(metric)
            ok = a is not None and b is not None and (b if invert else a) > 0
            row[column] = ((a / b) if invert else (b / a)) if ok else None


def requested_impl(label: str) -> str:
    """The ``attention.impl`` a row's variant label asks for (``curformer[impl=pytorch]``), else ``auto``."""
    found = re.search(r"[\[,]impl=([^,\]]+)", label)
    return found.group(1) if found else "auto"


def write_csv(rows: list[dict], columns: list[str], path: Path) -> Path:
    """``rows`` under ``columns``; rows of a variant also carry the ``attention.impl`` they ran (column ``impl``:
    ``--variant-overrides <name>:impl=<form>`` picks a form, docs/attention.md "Forms")."""
    if any("variant" in row for row in rows) and "impl" not in columns:
        columns = [*columns, "impl"]
        rows = [{**row, "impl": requested_impl(str(row.get("variant", "")))} for row in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def format_table(rows: list[dict], columns: list[tuple[str, str, Callable[[object], str]]]) -> str:
    """Plain-text table; ``columns`` are ``(key, header, formatter)``; missing values print as ``-``."""
    cells = [[header for _, header, _ in columns]]
    cells += [[fmt(row[key]) if row.get(key) is not None else "-" for key, _, fmt in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def default_out_dir() -> Path:
    """``outputs/bench/<timestamp with microseconds>/`` in the checkout (git-ignored)."""
    return REPO_ROOT / "outputs" / "bench" / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")


def times(value: float) -> str:
    return f"{value:.2f}×"


def mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def ms(value: float) -> str:
    return f"{value * 1e3:.2f}"


def giga(value: float) -> str:
    return f"{value / 1e9:.3f}"


def giga_rate(value: float) -> str:
    return f"{value / 1e9:.1f}"
