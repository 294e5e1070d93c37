"""A config-group choice with no config is refused before anything runs (lra.runtime.config_groups), naming the closest."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException

from lra.runtime.config_groups import group_options, unknown_choices
from tests.conftest import CONFIG_DIR, run_in_process


@pytest.mark.parametrize("override, named", [
    ("experiment=listops_dep", "Did you mean experiment=listops_deep?"),
    ("experiment=cur_tabel1", "Did you mean experiment=cur_table1?"),
    ("attention=softmax,curformr", "Did you mean attention=curformer?"),  # a sweep's values too
    ("model/positions=rotry", "Did you mean model/positions=rotary?"),
    ("+finetune=lora_", "Did you mean finetune=lora?"),
])
def test_an_unknown_choice_is_named_with_the_closest_option(override, named):
    (problem,) = unknown_choices([override, "seed=1", "task.max_length=10"])
    assert named in problem
    group = override.lstrip("+").split("=")[0]
    assert ", ".join(group_options(group)) in problem  # every option listed


def test_known_choices_null_deletions_and_hydra_groups_pass():
    assert unknown_choices(["experiment=listops_deep", "experiment=null", "~finetune", "attention=softmax,curformer",
                            "hydra/launcher=joblib", "seed=3", "model/positions=rotary"]) == []


def test_hydra_itself_refuses_an_unknown_experiment():
    """The group's default is no longer ``optional``: the compose API (tests, tools) refuses it too."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        with pytest.raises(MissingConfigException, match="listops_deep"):
            compose(config_name="train", overrides=["experiment=listops_dep"])


@pytest.mark.parametrize("module", ["lra.train", "lra.evaluate"])
def test_a_misspelled_experiment_exits_before_anything_is_written(module, tmp_path):
    run_dir = tmp_path / "run"
    checkpoint = ["ckpt_path=x.ckpt"] if module == "lra.evaluate" else []
    proc = run_in_process(["-m", module, "experiment=listops_dep", *checkpoint, f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[lra] FAILED: experiment=listops_dep") and "listops_deep" in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr and not run_dir.exists()


def test_options_on_a_search_path_count(tmp_path):
    extra = tmp_path / "attention"
    extra.mkdir()
    (extra / "softmax_b.yaml").write_text("name: softmax_b\n")
    assert unknown_choices(["attention=softmax,softmax_b", f"hydra.searchpath=[file://{tmp_path}]"]) == []
    assert unknown_choices(["attention=softmax_b"], config_dir=str(tmp_path)) == []
    (problem,) = unknown_choices(["attention=softmax_c", f"hydra.searchpath=[file://{tmp_path}]"])
    assert "Did you mean attention=softmax_b?" in problem
    assert unknown_choices(["attention=softmax_c", "hydra.searchpath=[pkg://somewhere]"]) == []  # left to Hydra
