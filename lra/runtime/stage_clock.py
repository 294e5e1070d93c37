"""Wall time of a training stage summed over the processes of a resumed run.

A run interrupted by SIGTERM (or killed) and resumed with the same command trains in several processes; its
``results.json`` reports the whole stage's ``train_time_s`` (and ``pretrain_time_s``), not only the last
process's. The clock is kept in every checkpoint the stage writes and restored from the one it resumes from, so
time spent after that checkpoint by a killed process (whose steps are lost too) is not counted.
"""

from __future__ import annotations

import time


class StageClock:
    """Seconds before this process (from the checkpoint resumed from) plus this process's since :meth:`start`."""

    def __init__(self) -> None:
        self.before = 0.0
        self.started: float | None = None

    def start(self) -> None:
        self.started = time.perf_counter()

    def seconds(self) -> float:
        return self.before + (0.0 if self.started is None else time.perf_counter() - self.started)
