"""Reading a run's console output in tests: the states its progress bars were drawn in, and the other lines."""

from __future__ import annotations

import re

BAR = re.compile(r"^(\w+): +\d+%\|[^|]*\| (\d+)/(\d+) ")  # tqdm's "<name>:  33%|███▎      | 20/60 [...]"


def bar_states(output: str, name: str) -> list[tuple[int, int]]:
    """``(n, total)`` of every drawing of the bar called ``name``, in order (tqdm redraws a line after ``\\r``)."""
    states = (BAR.match(part.strip()) for part in re.split(r"[\r\n]", output))
    return [(int(m.group(2)), int(m.group(3))) for m in states if m and m.group(1) == name]


def other_lines(output: str) -> list[str]:
    """The lines that are not a progress bar's drawing (nor blank, nor the spaces tqdm erases a bar with)."""
    return [part.strip() for part in re.split(r"[\r\n]", output) if part.strip() and not BAR.match(part.strip())]


def sweep_table(output: str, sweep_dir) -> tuple[str, list[dict[str, str]]]:
    """The closing summary of a sweep (lra/runtime/sweep_console.py): its first line and its table's rows as dicts."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"[lra] sweep {sweep_dir}: "))
    cells = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[start + 1:]
             if line.startswith("|")]
    header, _, *rows = cells
    return lines[start], [dict(zip(header, row)) for row in rows]
