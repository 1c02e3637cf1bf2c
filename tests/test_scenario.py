"""Scenario files: strict schema, machine checks before any launch, DeepSpeed/Accelerate configs per variant."""

from __future__ import annotations

import copy
import glob
import json
import os

import pytest
import yaml

from helpers import REPO, refused_run, tiny_data, write_scenario
from zbench import ds_config
from zbench.accelerate_config import load_accelerate_config
from zbench.plan import build_plan
from zbench.scenario import ScenarioError, parse_scenario

BASE = tiny_data(
    [{"name": "ddp", "engine": "ddp"}, {"name": "zero2", "engine": "zero", "stage": 2}], steps=2, batch_size=2, lr=None
)


def variant(**kw):
    d = copy.deepcopy(BASE)
    d["variants"].append(kw)
    return d


@pytest.mark.parametrize(
    "mutate,expected",
    [
        (lambda d: d["variants"][1].update(stgae=2), "unknown key 'variants[1].stgae'; did you mean 'stage'?"),
        (lambda d: d.update(seq_lne=16), "unknown key 'seq_lne'; did you mean 'seq_len'?"),
        (lambda d: d["data"]["synthetic"].update(vocb=9), "unknown key 'data.synthetic.vocb'; did you mean 'vocab'?"),
        (lambda d: d["model"].update(arhc="x"), "unknown key 'model.arhc'; did you mean 'arch'?"),
        (lambda d: d.pop("seq_len"), "seq_len is required"),
        (lambda d: d.update(epochs=1), "sets both 'epochs' and 'steps'; give exactly one of them"),
        (lambda d: d["variants"][0].update(stage=1), "'stage' applies to zero and deepspeed variants"),
        (lambda d: d["variants"][1].update(engine="zer0"), "variants[1].engine"),
        (lambda d: d["variants"].append({"name": "ddp", "engine": "ddp"}), "variant name 'ddp' is used twice"),
        (lambda d: d.update(metric="f1"), "metric 'f1' does not apply to task 'lm'"),
        (lambda d: d.update(timing_skip_steps=d["steps"]), "leaves none of the"),
        (
            lambda d: d["variants"][1].update(nvme_path="/tmp"),
            "'nvme_path' goes with offload_optimizer or offload_param: nvme",
        ),
        (lambda d: d.update(batch_search={"multiple_of": 0}), "batch_search.multiple_of"),
        (lambda d: d.update(cuda_alloc_conf="expandable segments"), "e.g. 'expandable_segments:True'"),
    ],
)
def test_schema_errors_are_one_line(mutate, expected):
    data = copy.deepcopy(BASE)
    mutate(data)
    with pytest.raises(ScenarioError) as err:
        parse_scenario(data)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_every_shipped_scenario_plans(monkeypatch):
    """Every scenario in scenarios/ still reads through the strict reader and plans on this machine (as rank 0
    of its world when it wants more ranks than a CPU run allows; DeepSpeed variants as if it were installed)."""
    import zbench.plan

    from zbench.plan import transformers_available
    from zbench.scenario import load_scenario

    monkeypatch.setattr(zbench.plan, "deepspeed_available", lambda: True)
    paths = sorted(glob.glob(os.path.join(REPO, "scenarios", "*.yaml")))
    assert len(paths) >= 12
    for path in paths:
        sc = load_scenario(path)
        hf = sc.model.pretrained or load_arch_family(sc, path) == "hf"
        if hf and not transformers_available():
            continue  # parsed and its model config checked; planning needs transformers
        plan = build_plan(path, simulate=sc.gpus if sc.gpus > 1 else None)
        assert [v.name for v in plan.variants] == [v.name for v in sc.variants]


def load_arch_family(sc, path) -> str:
    from zbench.models.configs import load_arch

    return load_arch(str(sc.model.arch), os.path.dirname(path), sc.model.overrides).family


def test_unknown_key_before_launch(tmp_path):
    path = write_scenario(tmp_path, variant(name="z3", engine="zero", stgae=3))
    assert "did you mean 'stage'" in refused_run(tmp_path, path)


def test_missing_model_config(tmp_path):
    data = copy.deepcopy(BASE)
    data["model"] = {"arch": "gpt-nonexistent"}
    text = refused_run(tmp_path, write_scenario(tmp_path, data))
    assert "model.arch 'gpt-nonexistent'" in text and "no model config file" in text


def test_deepspeed_variant_without_deepspeed(tmp_path, monkeypatch):
    import zbench.plan

    monkeypatch.setattr(zbench.plan, "deepspeed_available", lambda: False)
    text = refused_run(tmp_path, write_scenario(tmp_path, variant(name="ds", engine="deepspeed", stage=2)))
    assert "variant 'ds' needs DeepSpeed" in text and "pip install deepspeed" in text


def test_more_gpus_than_cpu_ranks_allowed(tmp_path):
    data = copy.deepcopy(BASE)
    data["gpus"] = (os.cpu_count() or 1) * 4 + 1
    text = refused_run(tmp_path, write_scenario(tmp_path, data))
    assert "no GPU here" in text and "--gpus" in text


def test_more_gpus_than_present(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    data = copy.deepcopy(BASE)
    data["gpus"] = 4
    text = refused_run(tmp_path, write_scenario(tmp_path, data))
    assert "asks for 4 GPUs per node but this machine has 2" in text


def test_cpu_ranks_are_allowed_with_a_note(tmp_path):
    plan = build_plan(write_scenario(tmp_path, BASE))
    assert plan.device == "cpu" and any("CPU rank" in n for n in plan.notes)


def test_zero_variant_config_rejected_by_zero_core(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 5}}))
    text = refused_run(tmp_path, write_scenario(tmp_path, variant(name="zb", engine="zero", ds_config="bad.json")))
    assert "variant 'zb'" in text and "did you mean 'reduce_bucket_size'" in text


def test_variant_config_file_with_a_duplicate_key(tmp_path):
    (tmp_path / "dup.json").write_text('{"zero_optimization": {"stage": 2, "stage": 3}}')
    text = refused_run(tmp_path, write_scenario(tmp_path, variant(name="zd", engine="zero", ds_config="dup.json")))
    assert "has the key 'stage' twice" in text


def test_nvme_parameter_offload_variant_gets_its_folder(tmp_path):
    plan = build_plan(
        write_scenario(tmp_path, variant(name="nvme", engine="zero", stage=3, offload_param="nvme", nvme_path="swap"))
    )
    nvme = [v for v in plan.variants if v.name == "nvme"][0]
    assert "NVMe offload (param)" in nvme.label
    assert nvme.ds_template["zero_optimization"]["offload_param"] == {
        "device": "nvme",
        "nvme_path": str(tmp_path / "swap"),
    }
    assert all(v.status == "ready" for v in plan.variants)


def test_variants_filter(tmp_path):
    path = write_scenario(tmp_path, BASE)
    assert [v.name for v in build_plan(path, only=["zero2"]).variants] == ["zero2"]
    assert "no variant named 'zero9'" in refused_run(tmp_path, path, "--variants", "zero9")


def test_accelerate_plugin_yaml_translates_like_accelerate():
    ds = load_accelerate_config(os.path.join(REPO, "scenarios", "configs", "accelerate_zero2.yaml"))
    assert ds["zero_optimization"] == {
        "stage": 2,
        "offload_optimizer": {"device": "none"},
        "offload_param": {"device": "none"},
    }
    assert ds["gradient_accumulation_steps"] == 1 and ds["gradient_clipping"] == 1.0
    assert ds["fp16"] == {"enabled": True}
    assert ds["train_micro_batch_size_per_gpu"] == "auto"


def test_accelerate_config_file_and_errors(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    good = {
        "distributed_type": "DEEPSPEED",
        "mixed_precision": "bf16",
        "deepspeed_config": {"deepspeed_config_file": "ds.json", "zero3_init_flag": True},
    }
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(good))
    ds = load_accelerate_config(str(tmp_path / "a.yaml"))
    assert ds == {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    mixed = copy.deepcopy(good)
    mixed["deepspeed_config"]["zero_stage"] = 2
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(mixed))
    with pytest.raises(ValueError, match="cannot be combined with deepspeed_config_file"):
        load_accelerate_config(str(tmp_path / "b.yaml"))
    typo = {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stag": 2}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(typo))
    with pytest.raises(ValueError, match="did you mean 'zero_stage'"):
        load_accelerate_config(str(tmp_path / "c.yaml"))


def test_ds_config_autos_filled_like_hf_trainer(tmp_path):
    sc = parse_scenario(
        variant(name="z", engine="zero", ds_config="x.json") | {"lr": 2e-5, "warmup_steps": 7, "precision": "fp16"}
    )
    raw = json.load(open(os.path.join(REPO, "scenarios", "configs", "zero2_config_accelerate.json")))
    (tmp_path / "x.json").write_text(json.dumps(raw))
    tmpl = ds_config.template(sc, sc.variants[-1], str(tmp_path))
    final = ds_config.finalize(tmpl, sc=sc, batch=5, world_size=2, total_steps=40, hidden=64)
    assert final["train_micro_batch_size_per_gpu"] == 5 and final["train_batch_size"] == 10
    assert final["optimizer"]["params"]["lr"] == 2e-5 and final["optimizer"]["params"]["weight_decay"] == 0.0
    assert final["scheduler"]["params"]["warmup_num_steps"] == 7
    assert final["scheduler"]["params"]["total_num_steps"] == 40
    assert final["gradient_clipping"] == 1.0
    from zero_core import load_config

    assert load_config(final, 2).stage == 2


def test_precision_conflict_with_file(tmp_path):
    (tmp_path / "fp16.json").write_text(json.dumps({"fp16": {"enabled": True}}))
    text = refused_run(tmp_path, write_scenario(tmp_path, variant(name="z", engine="zero", ds_config="fp16.json")))
    assert "enables fp16 but the scenario's precision is fp32" in text


def test_seq_len_longer_than_model(tmp_path):
    data = copy.deepcopy(BASE)
    data["seq_len"] = 65
    assert "exceeds the 64 positions" in refused_run(tmp_path, write_scenario(tmp_path, data))


def test_resume_needs_the_same_scenario(tmp_path):
    folder = tmp_path / "old-run"
    folder.mkdir()
    (folder / "scenario.yaml").write_text("name: something-else\n")
    text = refused_run(tmp_path, write_scenario(tmp_path, BASE), "--resume", str(folder))
    assert "another version of the scenario" in text


@pytest.mark.parametrize(
    "source,expected",
    [
        (
            {"accelerate_config": "configs/accelerate_zero2.yaml"},
            True,
        ),  # no optimizer section: the script's torch AdamW
        ({"ds_config": "configs/zero2_config_accelerate.json"}, True),  # the file says torch_adam itself
        ({"stage": 2}, True),
        ({"stage": 2, "offload_optimizer": "cpu"}, None),  # offload needs DeepSpeedCPUAdam
    ],
)
def test_deepspeed_variants_get_torch_adamw_unless_told_otherwise(source, expected):
    sc = parse_scenario(variant(name="ds", engine="deepspeed", **source) | {"precision": "fp16"})
    ds = ds_config.template(sc, sc.variants[-1], os.path.join(REPO, "scenarios"))
    assert ds["optimizer"]["params"].get("torch_adam") is expected


def test_nvme_offload_without_a_path_is_an_error_before_launch(tmp_path):
    path = write_scenario(tmp_path, variant(name="z", engine="zero", offload_optimizer="nvme"))
    text = refused_run(tmp_path, path)
    assert "nvme_path is required" in text and "give the variant nvme_path: DIR" in text


def test_variant_nvme_path_lands_in_the_config(tmp_path):
    sc = parse_scenario(variant(name="z", engine="zero", offload_optimizer="nvme", nvme_path="swap"))
    ds = ds_config.template(sc, sc.variants[-1], str(tmp_path))
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "nvme", "nvme_path": str(tmp_path / "swap")}


def test_cuda_alloc_conf_reaches_the_ranks_before_anything_allocates(monkeypatch):
    """The scenario's allocator setting is in each rank's environment before the process group (and so
    CUDA) is set up: the allocator reads it once, at its first allocation."""
    from zbench import worker

    seen = {}

    def stop(*_a, **_k):
        seen["conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        raise RuntimeError("stop here")

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(worker, "setup", stop)
    sc = parse_scenario({**copy.deepcopy(BASE), "cuda_alloc_conf": "expandable_segments:True"})
    with pytest.raises(RuntimeError, match="stop here"):
        worker.run_job(json.dumps({"scenario": sc.model_dump(mode="json")}))
    assert seen["conf"] == "expandable_segments:True"
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    with pytest.raises(RuntimeError, match="stop here"):  # absent: the environment is left as the user set it
        worker.run_job(json.dumps({"scenario": copy.deepcopy(BASE)}))
    assert seen["conf"] is None


def test_a_feature_zero_core_lacks_is_a_row_a_mistake_is_refused(tmp_path):
    """UnsupportedFeature (the config's only problem is a feature zero_core lacks) plans an "unsupported" row; the
    same feature beside a real mistake refuses the scenario."""
    lacking = {"zero_optimization": {"stage": 2}, "aio": {"use_gds": True}}
    (tmp_path / "gds.json").write_text(json.dumps(lacking))
    plan = build_plan(write_scenario(tmp_path, variant(name="zg", engine="zero", ds_config="gds.json")))
    (row,) = [p for p in plan.variants if p.name == "zg"]
    assert row.status == "unsupported" and "GPUDirect Storage" in row.reason
    mixed = {"zero_optimization": {"stage": 2, "reduce_bucket_size": -1}, "aio": {"use_gds": True}}
    (tmp_path / "mixed.json").write_text(json.dumps(mixed))
    text = refused_run(tmp_path, write_scenario(tmp_path, variant(name="zm", engine="zero", ds_config="mixed.json")))
    assert "variant 'zm'" in text and "reduce_bucket_size" in text
