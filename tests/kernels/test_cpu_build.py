"""The C++ kernels: one build module (kernels/common/build.py) for every source, the cache keyed by source, headers
and flags, and the layout by method, then device: ``kernels/<method>/cpu.cpp`` (and ``cpu_<part>.cpp``) beside
``cpu.py``, its bindings and autograd nodes or custom op, and the method's one plain PyTorch reference ``naive.py``;
the shared headers in kernels/common. The lists below are read from the tree: a new method is covered by adding it."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from kernels.common import build

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "kernels"
SOURCES = sorted(path.relative_to(KERNELS).as_posix() for path in KERNELS.rglob("*.cpp"))


def test_every_cpp_kernel_lives_beside_its_binding():
    """No C++ source or header and no compiler call outside kernels/ (the methods only call into it); every source is
    a method's ``cpu.cpp`` or ``cpu_<part>.cpp``, bound by the ``cpu.py`` beside it; headers only in kernels/common."""
    stray = [path for folder in ("attention", "models", "lra") for pattern in ("*.cpp", "*.h")
             for path in (REPO / folder).rglob(pattern)]
    assert stray == []
    callers = [path for folder in ("attention", "models", "lra") for path in (REPO / folder).rglob("*.py")
               if "subprocess" in path.read_text() and "c++" in path.read_text()]
    assert callers == []
    assert SOURCES and all(name.count("/") == 1 and name.split("/")[1].startswith("cpu") for name in SOURCES)
    assert all((KERNELS / name).with_name("cpu.py").is_file() for name in SOURCES)
    assert sorted(path.relative_to(KERNELS).as_posix() for path in KERNELS.rglob("*.h")) == [
        "common/landmark_attention.h", "common/simd.h"]
    assert not (KERNELS / "cpu").exists(), "no separate C++ tree: a method's C++ kernels live in kernels/<method>/"


@pytest.mark.parametrize("method", sorted(path.parent.name for path in KERNELS.glob("*/naive.py")))
def test_one_folder_per_method(method):
    """kernels/<method>/ holds __init__.py and naive.py (the one plain PyTorch reference every form is tested
    against: it calls no kernel), and its registration: ops.py (Triton) and/or cpu.py (C++)."""
    folder = KERNELS / method
    assert (folder / "__init__.py").is_file() and ((folder / "ops.py").is_file() or (folder / "cpu.py").is_file())
    imports = [line for line in (folder / "naive.py").read_text().splitlines() if line.startswith(("from ", "import "))]
    assert not [line for line in imports if "kernels" in line], "naive.py is plain PyTorch: it calls no kernel"
    assert len(list(folder.rglob("naive*.py"))) == 1, "one plain reference per method"


@pytest.mark.parametrize("name", SOURCES)
def test_every_kernel_builds_with_the_shared_simd_header(name):
    """Each source compiles through build.build for this CPU's instruction set and includes simd.h (directly or
    through landmark_attention.h), whose hash is part of its cache key."""
    path = build.source(name)
    headers = [header.name for header in build.local_headers(path)]
    assert "simd.h" in headers or name == "dropout/cpu.cpp"
    assert all(header.parent == KERNELS / "common" for header in build.local_headers(path))
    assert ctypes.CDLL(str(build.build(path)))


def test_missing_compiler_is_a_clear_error():
    with pytest.raises(RuntimeError, match="C\\+\\+ compiler 'no-such-c\\+\\+' was not found"):
        build.build(build.source("l1/cpu.cpp"), compiler="no-such-c++")


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
