"""trainer=ddp_cpu: two gloo processes train through the real CLI; rank 0 alone writes results.json."""

from __future__ import annotations

import json

import pytest

from tests.conftest import compose_config, run_cli, run_in_process


@pytest.mark.process
def test_ddp_cpu_trains_with_two_processes_and_writes_once(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["-m", "lra.train", *tiny_listops_overrides, "trainer=ddp_cpu", "verbose=true",  # Lightning's INFO
                    f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in output  # a second rank joined
    assert (run_dir / "train_ddp_process_1.log").exists()  # rank 1 ran in the same run dir
    (results,) = list(tmp_path.rglob("results.json"))
    record = json.loads(results.read_text())
    assert results.parent == run_dir and record["status"] == "completed" and record["steps"] == 4
    assert 0.0 <= record["test_acc"] <= 1.0
    assert proc.stdout.count("[lra] test acc") == 2  # both ranks finished, one file


def test_ddp_configs_compose():
    cpu = compose_config(["trainer=ddp_cpu"]).trainer
    assert (cpu.accelerator, cpu.devices, cpu.strategy.process_group_backend) == ("cpu", 2, "gloo")
    gpu = compose_config(["trainer=ddp", "trainer.num_nodes=2", "trainer.devices=4"]).trainer
    assert (gpu.accelerator, gpu.strategy.process_group_backend, gpu.num_nodes, gpu.devices) == ("gpu", "nccl", 2, 4)


def test_ddp_in_a_local_multirun_is_refused_with_the_fix(tiny_listops_overrides, tmp_path):
    proc = run_in_process(["-m", "lra.train", "-m", *tiny_listops_overrides, "trainer=ddp_cpu", "seed=0,1",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert proc.returncode == 1
    assert "cannot run inside a local multirun" in proc.stderr and "submitit_slurm" in proc.stderr
