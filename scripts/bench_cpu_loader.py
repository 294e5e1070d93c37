"""The CPU kernels' loader against the library's: first-use build time and per-call overhead of the same L1
distance kernel (kernels/l1/cpu.cpp) bound by ctypes (kernels.common.build) and by torch.utils.cpp_extension with
torch.library registration. Prints one table; kernels/README.md records the numbers.

    python scripts/bench_cpu_loader.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

BINDING = r"""
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include "{source}"

at::Tensor l1_distance_op(const at::Tensor& q, const at::Tensor& kt, double scale) {{
  const int64_t p = q.size(0), a = q.size(1), d = q.size(2), b = kt.size(2);
  at::Tensor out = at::empty({{p, a, b}}, q.options());
  l1_distance_f32(q.data_ptr<float>(), a * d, kt.data_ptr<float>(), out.data_ptr<float>(), p, a, b, d,
                  static_cast<float>(scale), 1);
  return out;
}}

TORCH_LIBRARY(lra_loader_bench, m) {{ m.def("l1_distance(Tensor q, Tensor kt, float scale) -> Tensor"); }}
TORCH_LIBRARY_IMPL(lra_loader_bench, CPU, m) {{ m.impl("l1_distance", &l1_distance_op); }}
"""


def per_call(function, calls: int) -> float:
    for _ in range(100):
        function()
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["LRA_KERNEL_CACHE"] = cache
        from kernels.common import build
        from kernels.l1 import cpu as l1

        start = time.perf_counter()
        build.build(build.source("l1/cpu.cpp"))
        ctypes_build = time.perf_counter() - start
        l1.library()

        from torch.utils import cpp_extension

        simd_flags, width = build.simd()
        binding = Path(cache) / "binding.cpp"
        binding.write_text(BINDING.format(source=build.source("l1/cpu.cpp")))
        start = time.perf_counter()
        cpp_extension.load(name="lra_loader_bench", sources=[str(binding)], is_python_module=False,
                           extra_cflags=["-O3", *simd_flags, f"-DLRA_VECTOR_BYTES={width}"],
                           build_directory=cache, verbose=False)
        extension_build = time.perf_counter() - start

        q, kt = torch.randn(1, 8, 16), torch.randn(1, 16, 8)
        assert torch.equal(l1.distance(q, kt, -0.5), torch.ops.lra_loader_bench.l1_distance(q, kt, -0.5))
        ctypes_call = per_call(lambda: l1.distance(q, kt, -0.5), args.calls)
        op_call = per_call(lambda: torch.ops.lra_loader_bench.l1_distance(q, kt, -0.5), args.calls)
        aten_call = per_call(lambda: torch.cdist(q, kt.transpose(1, 2), p=1), args.calls)

    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"ATen {torch.backends.cpu.get_cpu_capability()}, one thread")
    print("| | first build (s) | per call, (1, 8, 16) x (1, 16, 8) (µs) |")
    print("|---|---|---|")
    print(f"| ctypes (kernels.common.build) | {ctypes_build:.1f} | {ctypes_call * 1e6:.1f} |")
    print(f"| cpp_extension + torch.library | {extension_build:.1f} | {op_call * 1e6:.1f} |")
    print(f"| (ATen torch.cdist, for scale) | - | {aten_call * 1e6:.1f} |")


if __name__ == "__main__":
    main()
