"""Build and load the C++ kernels: one compiler driver, one cache, one build-or-warn policy.

Each method's source (``kernels/<method>/cpu.cpp``, beside the ``cpu.py`` that binds it) is compiled on first use with the system C++ compiler (``$CXX``, else ``c++``; ``-O3``, the
SIMD flags of ``torch.backends.cpu.get_cpu_capability()`` and the matching vector size ``-DLRA_VECTOR_BYTES``)
into ``$LRA_KERNEL_CACHE`` (default ``~/.cache/lra-attention``), keyed by a hash of the source, the headers it
includes (beside it, else the shared ``simd.h`` and ``landmark_attention.h`` of kernels/common, which is on the include path)
and the flags, and loaded with ``ctypes``: a plain C ABI, no PyTorch headers (why not
``torch.utils.cpp_extension``: kernels/README.md).

Policy: a kernel with a PyTorch form to fall back on is loaded by :func:`load_or_warn` (no compiler, or a failed
build: one warning naming what runs instead); the L1 kernels have none and :func:`build` raises.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import torch

SIMD_FLAGS = {  # ATen CPU capability: compiler flags and the kernels' vector size in bytes (one register)
    "AVX512": (["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mavx2", "-mfma"], 64),
    "AVX2": (["-mavx2", "-mfma"], 32),
}
BASELINE = ([], 16)  # any other capability: the baseline instruction set (SSE2 on x86-64, NEON on AArch64)
I64, PTR = ctypes.c_int64, ctypes.c_void_p  # the kernels' integer and pointer argument types
SHARED = Path(__file__).parent  # kernels/common: the headers every method's source may include (simd.h, landmark_attention.h)
KERNELS = SHARED.parent  # kernels/: one folder per method


def source(name: str) -> Path:
    """The C++ source ``name`` under kernels/ (e.g. ``"l1/cpu.cpp"``)."""
    return KERNELS / name


def _label(path: Path) -> str:
    """``path`` as messages and the cache name it: relative to kernels/ (``l1/cpu.cpp``), else its file name."""
    return path.relative_to(KERNELS).as_posix() if path.is_relative_to(KERNELS) else path.name


def simd() -> tuple[list[str], int]:
    """Flags and vector bytes for this process's ``torch.backends.cpu.get_cpu_capability()``
    (``ATEN_CPU_CAPABILITY=default|avx2`` lowers it); the kernels' register tiles follow the vector size."""
    return SIMD_FLAGS.get(torch.backends.cpu.get_cpu_capability(), BASELINE)


def vector_bytes() -> int:
    """The kernels' vector size in bytes (operands padded to it where a kernel says so)."""
    return simd()[1]


def cache_dir() -> Path:
    if "LRA_KERNEL_CACHE" in os.environ:
        return Path(os.environ["LRA_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lra-attention"


def local_headers(path: Path) -> list[Path]:
    """The headers ``path`` includes (``#include "name.h"``: beside it, else in :data:`SHARED`), followed one
    level further (a shared header may include ``simd.h``): :func:`build` hashes them with the source, so an
    edited header never loads a library built before it."""
    found: list[Path] = []
    for file in (path, *[_header(path, name) for name in _includes(path)]):
        for name in _includes(file):
            header = _header(path, name)
            if header not in found:
                found.append(header)
    return found


def _header(path: Path, name: str) -> Path:
    """The header ``name`` as the compiler finds it for ``path``: beside the source, else on the include path
    (:data:`SHARED`)."""
    beside = path.with_name(name)
    return beside if beside.exists() or not (SHARED / name).exists() else SHARED / name


def _includes(path: Path) -> list[str]:
    return re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), flags=re.MULTILINE)


def build(path: Path, compiler: str | None = None) -> Path:
    """Compile ``path`` once per source, included headers (:func:`local_headers`), flags and compiler, and return
    the library's path; raises with the fix when there is no compiler or the build fails."""
    compiler = compiler or os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RuntimeError(
            f"the CPU kernels compile on first use ({_label(path)}), but the C++ compiler "
            f"{compiler!r} was not found on PATH: install one (e.g. 'apt-get install g++') or set CXX to its path"
        )
    simd_flags, width = simd()
    flags = ["-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", *simd_flags, f"-DLRA_VECTOR_BYTES={width}"]
    text = b"".join(file.read_bytes() for file in [path, *local_headers(path)])
    key = hashlib.sha256(text + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
    library = cache_dir() / f"{_label(path).replace('/', '_').removesuffix('.cpp')}-{key}.so"  # l1_cpu-<key>.so
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_name(f"{library.stem}.{os.getpid()}.partial.so")
        command = [compiler, *flags, f"-I{SHARED}", str(path), "-o", str(partial)]  # -I: shared headers
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"compiling {_label(path)} failed: {' '.join(command)}\n{result.stderr[-3000:]}")
        os.replace(partial, library)  # atomic: concurrent first uses never load a half-written library
    return library


def load(path: Path, vector_bytes_function: str | None, signatures: dict[str, list], restype=None,
         built: Path | None = None) -> ctypes.CDLL:
    """``path`` built by :func:`build` (or the library ``built`` from it) and loaded, each function's ``argtypes``
    (and ``restype``) set; the library's ``vector_bytes_function`` (when named) must agree with :func:`vector_bytes`."""
    lib = ctypes.CDLL(str(built or build(path)))
    if vector_bytes_function is not None and getattr(lib, vector_bytes_function)() != vector_bytes():
        raise RuntimeError(f"{_label(path)} was compiled for {getattr(lib, vector_bytes_function)()}-byte vectors, "
                           f"but kernels.common.build.vector_bytes() is {vector_bytes()}: they must agree")
    for name, argtypes in signatures.items():
        getattr(lib, name).argtypes = argtypes
        if restype is not None:
            getattr(lib, name).restype = restype
    return lib


def load_or_warn(path: Path, instead: str, vector_bytes_function: str | None, signatures: dict[str, list],
                 restype=None) -> ctypes.CDLL | None:
    """:func:`load`, or None with a warning that ``instead`` runs when it cannot be built (no compiler, or the
    compiler failed): for kernels that have a PyTorch form to fall back on."""
    try:
        built = build(path)
    except RuntimeError as error:
        warnings.warn(f"{instead}: {str(error).splitlines()[0]}")
        return None
    return load(path, vector_bytes_function, signatures, restype, built)
