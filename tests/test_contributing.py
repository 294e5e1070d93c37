"""CONTRIBUTING.md's variant recipe runs: its code blocks, filled in for a throw-away variant, in a copy of the tree.

The recipe's templates (module, config, test) are read from CONTRIBUTING.md, their placeholders filled for a toy
"softmax over scaled cosine similarities, with attention dropout", written into a copy of the source tree (the
checkout itself is never touched), and every command of the recipe's "Check" block is run there as written. A
recipe whose blocks stop fitting the code (an import moved, a test helper renamed, a check that misses dropout)
fails here."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

NAME, CLASS = "toy_cosine", "ToyCosineAttention"
# The toy's maths, for the `...` of the templates: softmax(4 cos(q, k)) over the real keys.
MODULE_WEIGHTS = ("torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(k, dim=-1).mT * 4.0\n"
                  "        weights = weights.masked_fill(~key_mask[:, None, None, :], float(\"-inf\")).softmax(-1)")
DENSE_BODY = ("import torch\n"
              "    cos = torch.einsum('bhid,bhjd->bhij', q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True))\n"
              "    scores = (4.0 * cos).masked_fill(~key_mask[:, None, None, :], float('-inf'))\n"
              "    return torch.softmax(scores, dim=-1) @ v")


def recipe_blocks() -> dict[str, list[str]]:
    """The fenced code blocks of CONTRIBUTING.md's "Add an attention variant" section, by language."""
    text = (REPO_ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Add an attention variant"):text.index("## Add a task")]
    blocks: dict[str, list[str]] = {}
    for language, body in re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S):
        blocks.setdefault(language, []).append(body)
    return blocks


def fill(template: str, placeholder: str, replacement: str) -> str:
    assert placeholder in template, f"CONTRIBUTING.md's template no longer has {placeholder!r}: update this test"
    return template.replace(placeholder, replacement)


def copy_of_the_tree(root: Path) -> Path:
    """The packages, configs and tests in ``root`` (data/ linked: listops_small is generated once, in the checkout)."""
    for folder in ("attention", "configs", "kernels", "lra", "models", "tests"):
        shutil.copytree(REPO_ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "CONTRIBUTING.md"):
        shutil.copy(REPO_ROOT / name, root / name)
    (root / "data").symlink_to(REPO_ROOT / "data", target_is_directory=True)
    return root


def check_commands(bash: str) -> list[list[str]]:
    """The "Check" block's commands (continuation lines joined, comments dropped) as argument lists."""
    commands = []
    for line in bash.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            commands.append(shlex.split(line))
    return commands


@pytest.mark.process
@pytest.mark.slow  # ~50 s: three processes in a copy of the tree (make test-slow runs it)
def test_the_variant_recipe_runs_end_to_end(tmp_path):
    blocks = recipe_blocks()
    module, test = blocks["python"][0], blocks["python"][1]
    existing_parts, config = blocks["yaml"]  # (i) a configuration of existing parts, (ii) a new method's config
    root = copy_of_the_tree(tmp_path / "tree")

    module = fill(fill(module, "<Class>", CLASS), "weights = ...", "weights = " + MODULE_WEIGHTS)
    (root / "attention" / f"{NAME}.py").write_text(module)
    (root / "configs" / "attention" / f"{NAME}.yaml").write_text(fill(fill(config, "<name>", NAME), "<Class>", CLASS))
    test = fill(test, "    ...  # the equation on full (B, H, n, n) weights, pad keys at -inf", "    " + DENSE_BODY)
    (root / "tests" / "attention" / f"test_{NAME}.py").write_text(fill(test, "<name>", NAME))
    (root / "configs" / "attention" / f"{NAME}_cur32.yaml").write_text(fill(existing_parts, "<name>", f"{NAME}_cur32"))

    commands = check_commands(fill(blocks["bash"][-1], "<name>", NAME).replace("/tmp/", f"{tmp_path}/"))
    assert [c[:3] for c in commands] == [[".venv/bin/python", "-m", "pytest"], ["python", "-m", "lra.bench"],
                                         ["python", "-m", "lra.train"]], commands
    commands[0].append(f"tests/test_configs.py::test_every_attention_builds_a_model[{NAME}_cur32]")  # (i)
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    for command in commands:
        proc = subprocess.run([sys.executable, *command[1:]], cwd=root, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{shlex.join(command)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        if command[2] == "pytest":
            assert "5 passed" in proc.stdout, proc.stdout[-2000:]  # its two tests, the two the recipe names, (i)
        elif command[2] == "lra.bench":
            assert re.search(rf"^{NAME}\s+ok\s+1\s+0\s", proc.stdout, re.M), proc.stdout  # one graph, no break
        else:
            assert "[lra] test acc" in proc.stdout + proc.stderr, proc.stdout[-2000:]


def test_the_map_in_attention_init_names_every_module():
    """attention/__init__.py's docstring is the map of the package: a new module is listed there."""
    import attention

    listed = set(re.findall(r"``(\w+)``", attention.__doc__))
    modules = {path.stem for path in (REPO_ROOT / "attention").glob("*.py") if path.stem != "__init__"}
    assert modules - listed == set(), f"add these to the map in attention/__init__.py: {sorted(modules - listed)}"
