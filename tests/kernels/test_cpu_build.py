"""kernels/cpu: one build module for every C++ kernel, the cache keyed by source, headers and flags, and the layout
(attention/ and models/ hold the methods; kernels/cpu/<method>/ every C++ source beside its bindings and autograd
nodes or custom op, ops.py, and its plain PyTorch reference, naive.py)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from kernels.cpu import build

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "kernels" / "cpu"
SOURCES = sorted(path.relative_to(CPU).as_posix() for path in CPU.rglob("*.cpp"))
METHODS = ["cur", "dropout", "l1", "landmarks", "pinv", "selection", "seqconv"]  # cur: no source, it chains landmarks/


def test_every_cpp_kernel_lives_in_kernels_cpu():
    """No C++ source or header and no compiler call outside kernels/cpu (the methods only call into it)."""
    stray = [path for folder in ("attention", "models", "lra") for pattern in ("*.cpp", "*.h")
             for path in (REPO / folder).rglob(pattern)]
    assert stray == []
    callers = [path for folder in ("attention", "models", "lra") for path in (REPO / folder).rglob("*.py")
               if "subprocess" in path.read_text() and "c++" in path.read_text()]
    assert callers == []
    assert SOURCES == ["dropout/dropout.cpp", "l1/l1.cpp", "landmarks/landmarks.cpp", "landmarks/landmarks_backward.cpp",
                       "pinv/pinv.cpp", "selection/selection.cpp", "seqconv/seqconv.cpp"]


@pytest.mark.parametrize("method", METHODS)
def test_one_folder_per_method(method):
    """kernels/cpu/<method>/ holds its sources, ops.py (the bindings, the autograd nodes or custom op, the function
    that chooses the backend) and naive.py (the plain PyTorch reference its tests compare against); kernels/cpu
    itself only the build driver and the headers several methods share."""
    folder = CPU / method
    assert all((folder / name).is_file() for name in ("__init__.py", "ops.py", "naive.py"))
    imports = [line for line in (folder / "naive.py").read_text().splitlines() if line.startswith(("from ", "import "))]
    assert not [line for line in imports if "kernels" in line], "naive.py is plain PyTorch: it calls no kernel"
    assert sorted(path.name for path in CPU.glob("*.h")) == ["landmarks.h", "simd.h"]


@pytest.mark.parametrize("name", SOURCES)
def test_every_kernel_builds_with_the_shared_simd_header(name):
    """Each source compiles through build.build for this CPU's instruction set and includes simd.h (directly or
    through landmarks.h), whose hash is part of its cache key."""
    path = build.source(name)
    headers = [header.name for header in build.local_headers(path)]
    assert "simd.h" in headers or name == "dropout/dropout.cpp"
    assert all(header.parent == CPU for header in build.local_headers(path) if header.name in ("simd.h", "landmarks.h"))
    assert ctypes.CDLL(str(build.build(path)))


def test_missing_compiler_is_a_clear_error():
    with pytest.raises(RuntimeError, match="C\\+\\+ compiler 'no-such-c\\+\\+' was not found"):
        build.build(build.source("l1/l1.cpp"), compiler="no-such-c++")


def test_an_edited_header_builds_a_new_library(monkeypatch, tmp_path):
    """``build`` hashes the headers a source includes, and the headers they include: a library built before an
    edit of either is never loaded."""
    monkeypatch.setenv("LRA_KERNEL_CACHE", str(tmp_path / "cache"))
    source, header, inner = tmp_path / "answer.cpp", tmp_path / "answer.h", tmp_path / "inner.h"
    source.write_text('#include "answer.h"\nextern "C" int answer() { return ANSWER + INNER; }\n')
    header.write_text('#include "inner.h"\n#define ANSWER 41\n')
    inner.write_text("#define INNER 0\n")
    assert build.local_headers(source) == [header, inner]
    before = build.build(source)
    header.write_text('#include "inner.h"\n#define ANSWER 42\n')
    after = build.build(source)
    assert after != before and ctypes.CDLL(str(after)).answer() == 42
    inner.write_text("#define INNER 1\n")
    assert ctypes.CDLL(str(build.build(source))).answer() == 43


def test_a_failed_build_warns_and_names_what_runs_instead(monkeypatch, tmp_path):
    """The build-or-warn policy: a kernel with a PyTorch form warns once and returns None."""
    monkeypatch.setenv("LRA_KERNEL_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    with pytest.warns(UserWarning, match="the PyTorch form runs: compiling broken.cpp failed"):
        assert build.load_or_warn(broken, "the PyTorch form runs", None, {}) is None
