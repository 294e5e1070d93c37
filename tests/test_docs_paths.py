"""The docs name only code that exists: every ``python -m`` target and every dotted ``lra.…``, ``attention.…``,
``kernels.…`` and ``models.…`` name in code (backticks, fenced blocks) in README.md, CONTRIBUTING.md and docs/*.md
resolves to a module, or to an attribute of one. Not scanned: docs/history/ (dated records that name modules as they
were when written) and docs/runs/, docs/evaluations/ (records). Not code: file names (``attention.md``), overrides (``+key=value``)
and attention config keys (``attention.num_landmarks``, ``attention.linear.chunk_size``), which share the
``attention.`` prefix with the package.
"""

from __future__ import annotations

import importlib
import re

import pytest
import yaml

from lra import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", REPO_ROOT / "CONTRIBUTING.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
QUOTED = re.compile(r"`([^`]+)`")
MODULE_RUN = re.compile(r"python -m ((?:lra|attention|kernels|models)(?:\.[A-Za-z_]\w*)*)")
DOTTED = re.compile(r"(?<![\w/.+-])((?:lra|attention|kernels|models)(?:\.[A-Za-z_]\w*)+)(?![\w/=-])")
# Quoted on purpose as wrong: docs/usage.md's example of a misspelled key and the error it gets.
WRONG_ON_PURPOSE = {"attention.num_landmark"}
FILE_SUFFIXES = ("md", "csv", "png", "pdf", "py", "yaml", "json", "ckpt", "log", "txt", "tsv", "cpp", "h", "so")


def attention_config_keys() -> set[str]:
    folder = REPO_ROOT / "configs" / "attention"
    keys = {path.name for path in folder.iterdir() if path.is_dir()}  # nested groups (attention/linear)
    for path in folder.rglob("*.yaml"):
        keys |= set(yaml.safe_load(path.read_text()) or {})
    return keys


def resolves(name: str) -> bool:
    """Whether ``name`` is a module, or a chain of attributes of the longest importable module prefix."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


def quoted_names() -> list[tuple[str, int, str]]:
    """``(doc, line, name)`` of every code name quoted in the docs (module doc)."""
    config_keys = attention_config_keys()
    found = []
    for doc in DOCS:
        if not doc.exists():
            continue
        fenced = False
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            for quoted in [line] if fenced else QUOTED.findall(line):
                names = set(MODULE_RUN.findall(quoted)) | set(DOTTED.findall(quoted))
                for name in sorted(names):
                    if name.rsplit(".", 1)[-1] in FILE_SUFFIXES or name in WRONG_ON_PURPOSE:
                        continue
                    if name.startswith("attention.") and name.split(".")[1] in config_keys:
                        continue
                    found.append((doc.relative_to(REPO_ROOT).as_posix(), number, name))
    return found


def test_the_docs_quote_code_names():
    names = quoted_names()
    assert len(names) > 50, names  # the scan sees the docs' names (e.g. every `python -m lra.train`)
    assert ("README.md", next(n for d, n, name in names if d == "README.md" and name == "lra.train"), "lra.train") in names


def test_every_quoted_code_name_resolves():
    missing = [f"{doc}:{line}: {name}" for doc, line, name in quoted_names() if not resolves(name)]
    assert missing == [], "docs name code that does not exist:\n" + "\n".join(missing)


def test_dated_records_are_not_scanned():
    assert not [doc for doc in DOCS if doc.parent != REPO_ROOT and doc.parent.name != "docs"]


@pytest.mark.parametrize("name, exists", [("lra.build.build_attention", True), ("attention.build_attention", False),
                                          ("lra.bench.plan", True), ("kernels.common.launch.recording", True)])
def test_resolution_tells_real_names_from_stale_ones(name, exists):
    assert resolves(name) is exists
