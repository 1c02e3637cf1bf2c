"""Bad inputs of the scenario runner for the reliability battery (a helper module, not a test module).

`write_inputs(box, scenario)` puts the files in the battery's folder; `CASES` are (argv, expected text)
in the battery's format ("{b}" is that folder). Kinds: model config values, scenario numbers, YAML that
is not plain data (duplicate keys, an alias bomb, deep nesting, Python tags), names that would become
paths outside the run folder or another variant's file, values of the wrong type in a variant's DeepSpeed
file, data too short to train on, flags out of range, and (bad_run_folder_cases.py) `report`/`estimate`/
`--resume` on folders that are not runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import bad_run_folder_cases
from helpers import QUICKSTART, REPO, TINY

BLENDERBOT = str(REPO / "zbench" / "model_configs" / "tiny-blenderbot.json")


def _lol(levels: int = 9) -> str:
    """YAML whose aliases expand to 9**levels strings ("billion laughs") in about 1 kB of text."""
    lines = ['laugh0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"laugh{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def write_inputs(box: Path, scenario: Callable[..., str]) -> None:
    """The battery's inputs for the cases below, written into `box`."""

    def model_file(name: str, family: str, config: dict, text: str | None = None) -> None:
        (box / name).write_text(text or json.dumps({"family": family, "config": config}))

    tiny = json.loads(Path(TINY).read_text())["config"]
    def ds_variant(config: str, **settings) -> str:
        return scenario(variants=[{"name": "z", "engine": "zero", "ds_config": config, **settings}])

    model_file("zero heads.json", "gpt", {**tiny, "n_head": 0})
    model_file("nan dropout.json", "gpt", {}, text='{"family": "gpt", "config": {"dropout": NaN}}')
    model_file("dup model.json", "gpt", {}, text='{"family": "gpt", "config": {"n_layer": 2, "n_layer": 3}}')
    model_file("huge model.json", "gpt", {**tiny, "n_layer": 10**9})
    (box / "empty model").mkdir()
    scenarios = {
        # model config values, in model.overrides, a variant's model_overrides, a model search and the files
        "heads zero": scenario(model={"arch": TINY, "overrides": {"n_head": 0}}),
        "width string": scenario(model={"arch": TINY, "overrides": {"n_embd": "64"}}),
        "layers list": scenario(model={"arch": TINY, "overrides": {"n_layer": [2]}}),
        "layers absurd": scenario(model={"arch": TINY, "overrides": {"n_layer": 10**9}}),
        "dropout two": scenario(model={"arch": TINY, "overrides": {"dropout": 2}}),
        "layers bool": scenario(model={"arch": TINY, "overrides": {"n_layer": True}}),
        "heads indivisible": scenario(variants=[{"name": "z", "engine": "zero", "model_overrides": {"n_head": 5}}]),
        "search key": scenario(model_search={"key": "n_layers", "values": [2, 4]}),
        "search value": scenario(model_search={"key": "n_layer", "values": [2, 20000]}),
        "file heads": scenario(model={"arch": "zero heads.json"}),
        "pretrained no config": scenario(model={"pretrained": "./empty model"}),
        "no text files": scenario(data={"text_files": []}),
        "text file folder": scenario(data={"text_files": ["empty model"]}),
        "file nan": scenario(model={"arch": "nan dropout.json"}),
        "file dup": scenario(model={"arch": "dup model.json"}),
        "hf type": scenario(model={"arch": BLENDERBOT, "overrides": {"d_model": 32.5}}, task="seq2seq"),
        "hf bool": scenario(model={"arch": BLENDERBOT, "overrides": {"scale_embedding": 1}}, task="seq2seq"),
        # scenario numbers
        "lr inf": scenario(lr=float("inf")),
        "lr nan": scenario(lr=float("nan")),
        "seed huge": scenario(seed=2**80),
        "batch quoted": scenario(batch_size="64"),
        "batch float": scenario(batch_size=8.0),
        "batch bool": scenario(batch_size=True),
        "seq huge": scenario(seq_len=10**7),
        "epochs huge": scenario(epochs=10**6),
        "gpus huge": scenario(gpus=10**6),
        "grad accum": scenario(grad_accum=1e6),
        "timeout huge": scenario(comm_timeout_s=1e300),
        "decay negative": scenario(weight_decay=-1),
        "flag number": scenario(measure_floor=1),
        "search inverted": scenario(batch_size=None, measure_floor=False, batch_search={"start": 64, "max": 8}),
        "eval batch": scenario(eval_batch_size=0),
        # names that would become paths
        "name climbs": scenario(variants=[{"name": "../../x", "engine": "ddp"}]),
        "name slash": scenario(variants=[{"name": "a/b", "engine": "ddp"}]),
        "name dot": scenario(variants=[{"name": ".hidden", "engine": "ddp"}]),
        "name nul": scenario(variants=[{"name": "a\0b", "engine": "ddp"}]),
        "name long": scenario(variants=[{"name": "x" * 300, "engine": "ddp"}]),
        "name absolute": scenario(name="/tmp/evil"),
        "name comma": scenario(name="a,b"),
        # an NVMe folder that cannot be made (under a plain file)
        "nvme blocked": scenario(variants=[{"name": "z", "engine": "zero", "stage": 2, "offload_optimizer": "nvme",
                                            "nvme_path": "plain file/swap"}]),
        # names zbench's own files take, or too long to quote whole
        "name probes": scenario(variants=[{"name": "a.probes", "engine": "ddp"}, {"name": "a", "engine": "ddp"}]),
        "name 120": scenario(variants=[{"name": "x" * 120, "engine": "ddp"}]),
        # a variant's DeepSpeed file: values of the wrong type, read before anything launches
        "ds offload string": ds_variant("offload string.json", offload_optimizer="cpu"),
        "ds stage auto": ds_variant("stage auto.json"),
        "ds zero auto": ds_variant("zero auto.json"),
        "ds micro huge": ds_variant("micro huge.json"),
        "ds micro float": ds_variant("micro float.json"),
        "ds empty": scenario(variants=[{"name": "z", "engine": "zero", "ds_config": ""}]),
        "ds inline": scenario(variants=[{"name": "z", "engine": "zero", "ds_config": {"zero_optimization": {}}}]),
        # a text file too short for a train block and an eval block
        "text short": scenario(data={"text_files": ["hello.txt"]}),
    }
    (box / "hello.txt").write_text("hello world")
    for name, config in {
        "offload string": {"zero_optimization": {"offload_optimizer": "cpu"}},
        "stage auto": {"zero_optimization": {"stage": "auto"}},
        "zero auto": {"zero_optimization": "auto"},
        "micro huge": {"train_micro_batch_size_per_gpu": 10**20},
        "micro float": {"train_micro_batch_size_per_gpu": 2.5},
    }.items():
        (box / f"{name}.json").write_text(json.dumps(config))
    (box / "plain file").write_text("not a folder\n")
    for name, text in scenarios.items():
        (box / f"{name}.yaml").write_text(text, encoding="utf-8")
    base = scenario()
    (box / "batch exp.yaml").write_text(base.replace("batch_size: 8", "batch_size: 1e30"))
    (box / "dup key.yaml").write_text(base + "seq_len: 64\n")
    (box / "dup nested.yaml").write_text(base + "model_search: {key: n_layer, key: n_head, values: [2]}\n")
    (box / "lol.yaml").write_text(base + _lol())
    (box / "deep.yaml").write_text(base + "notes: " + "[" * 200 + "]" * 200 + "\n")
    (box / "self alias.yaml").write_text(base + "loop: &me [*me]\n")
    (box / "python tag.yaml").write_text(base + "notes: !!python/object/apply:os.system ['true']\n")
    (box / "acc dup.yaml").write_text("distributed_type: DEEPSPEED\ndistributed_type: NO\n")
    (box / "acc lol.yaml").write_text("distributed_type: DEEPSPEED\n" + _lol())
    (box / "accelerate dup.yaml").write_text(
        scenario(variants=[{"name": "z", "engine": "zero", "accelerate_config": "acc dup.yaml"}])
    )
    (box / "accelerate lol.yaml").write_text(
        scenario(variants=[{"name": "z", "engine": "zero", "accelerate_config": "acc lol.yaml"}])
    )
    bad_run_folder_cases.write_inputs(box)


R = ["--out", "{b}/runs"]
CASES = [
    (["run", "{b}/heads zero.yaml", *R], "model.overrides.n_head must be a whole number from 1 to 65,536, got 0"),
    (
        ["run", "{b}/width string.yaml", *R],
        "model.overrides.n_embd must be a whole number from 1 to 1,048,576, got '64'",
    ),
    (["run", "{b}/layers list.yaml", *R], "model.overrides.n_layer must be a whole number from 1 to 10,000, got [2]"),
    (["run", "{b}/layers absurd.yaml", *R], "model.overrides.n_layer must be a whole number from 1 to 10,000"),
    (["run", "{b}/dropout two.yaml", *R], "model.overrides.dropout must be a finite number (0 <= x < 1), got 2"),
    (["run", "{b}/layers bool.yaml", *R], "model.overrides.n_layer must be a whole number from 1 to 10,000, got True"),
    (["run", "{b}/heads indivisible.yaml", *R], "n_embd 64 is not divisible by n_head 5"),
    (["run", "{b}/search key.yaml", *R], "model_search.key 'n_layers' is not a size field of 'tiny-gpt'"),
    (["run", "{b}/search value.yaml", *R], "model_search.values.n_layer must be a whole number from 1 to 10,000"),
    (["run", "{b}/file heads.yaml", *R], "zero heads.json: config.n_head must be a whole number from 1 to 65,536"),
    (
        ["run", "{b}/file nan.yaml", *R],
        "nan dropout.json: config.dropout must be a finite number (0 <= x < 1), got nan",
    ),
    (["run", "{b}/file dup.yaml", *R], "has the key 'n_layer' twice"),
    (["run", "{b}/hf type.yaml", *R], "model.overrides.d_model must be a whole number from 1 to 1,048,576, got 32.5"),
    (
        ["run", "{b}/hf bool.yaml", *R],
        "model.overrides.scale_embedding must be true or false like the base config's True",
    ),
    (["estimate", "--model", "{b}/huge model.json"], "config.n_layer must be a whole number from 1 to 10,000"),
    (["run", "{b}/lr inf.yaml", *R], "lr must be a finite number (x > 0), got inf"),
    (["run", "{b}/lr nan.yaml", *R], "lr must be a finite number (x > 0), got nan"),
    (["run", "{b}/seed huge.yaml", *R], "seed must be a whole number from 0 to 4,294,967,295"),
    (["run", "{b}/batch exp.yaml", *R], "batch_size must be a whole number from 1 to 65,536, got 1e+30"),
    (
        ["run", "{b}/batch quoted.yaml", *R],
        "batch_size must be a whole number from 1 to 65,536 (without quotes), got '64'",
    ),
    (["run", "{b}/batch float.yaml", *R], "batch_size must be a whole number from 1 to 65,536, got 8.0"),
    (["run", "{b}/batch bool.yaml", *R], "batch_size must be a whole number from 1 to 65,536, got True"),
    (["run", "{b}/seq huge.yaml", *R], "seq_len must be a whole number from 1 to 1,048,576"),
    (["run", "{b}/epochs huge.yaml", *R], "epochs must be a whole number from 1 to 10,000"),
    (["run", "{b}/gpus huge.yaml", *R], "gpus must be a whole number from 1 to 1,024"),
    (["run", "{b}/grad accum.yaml", *R], "grad_accum must be a whole number from 1 to 65,536, got 1000000.0"),
    (["run", "{b}/timeout huge.yaml", *R], "comm_timeout_s must be a finite number (0 < x <= 604,800)"),
    (["run", "{b}/decay negative.yaml", *R], "weight_decay must be a finite number (x >= 0), got -1"),
    (["run", "{b}/flag number.yaml", *R], "measure_floor must be true or false, got 1"),
    (["run", "{b}/search inverted.yaml", *R], "lies between start 64 and max 8"),
    (
        ["run", "{b}/nvme blocked.yaml", *R],
        "/plain file/swap' cannot be created (Not a directory); create it or give the variant a folder on a local disk",
    ),
    (["run", "{b}/eval batch.yaml", *R], "eval_batch_size must be a whole number from 1 to 65,536, got 0"),
    (["run", "{b}/dup key.yaml", *R], "has the key 'seq_len' twice in one mapping (lines"),
    (["run", "{b}/dup nested.yaml", *R], "has the key 'key' twice in one mapping"),
    (["run", "{b}/lol.yaml", *R], "expands to more than 100,000 values through its aliases"),
    (["run", "{b}/deep.yaml", *R], "nests deeper than 64 levels"),
    (["run", "{b}/self alias.yaml", *R], "refers to itself through an alias"),
    (["run", "{b}/python tag.yaml", *R], "zbench reads plain YAML data only"),
    (["run", "{b}/accelerate dup.yaml", *R], "has the key 'distributed_type' twice"),
    (["run", "{b}/accelerate lol.yaml", *R], "expands to more than 100,000 values"),
    (["run", "{b}/name climbs.yaml", *R], "variants[0].name '../../x' is not a plain name"),
    (["run", "{b}/name slash.yaml", *R], "variants[0].name 'a/b' is not a plain name"),
    (["run", "{b}/name dot.yaml", *R], "variants[0].name '.hidden' is not a plain name"),
    (["run", "{b}/name nul.yaml", *R], "variants[0].name 'a\\x00b' is not a plain name"),
    (["run", "{b}/name long.yaml", *R], "is longer than 255 bytes"),
    (["run", "{b}/name absolute.yaml", *R], "name '/tmp/evil' is not a plain name"),
    (["run", "{b}/name comma.yaml", *R], "name 'a,b' is not a name zbench uses in paths"),
    (["run", "{b}/name probes.yaml", *R], "variants[0].name 'a.probes' ends in '.probes': variants/a.probes.json is"),
    (["run", "{b}/name 120.yaml", *R], "variants[0].name '" + "x" * 59 + "…' is not a name zbench uses in paths"),
    (
        ["run", "{b}/ds offload string.yaml", *R],
        "Error: variant 'z': zero_optimization.offload_optimizer must be an object such as {\"device\": \"cpu\"}, "
        "got 'cpu'",
    ),
    (["run", "{b}/ds stage auto.yaml", *R], "zero_optimization.stage must be 0, 1, 2 or 3, got 'auto'"),
    (["run", "{b}/ds zero auto.yaml", *R], "Error: variant 'z': zero_optimization must be an object {...}, got 'auto'"),
    (
        ["run", "{b}/ds micro huge.yaml", *R],
        'train_micro_batch_size_per_gpu must be "auto" or a whole number from 1 to 65,536',
    ),
    (["run", "{b}/ds micro float.yaml", *R], "or a whole number from 1 to 65,536 (the range of the scenario's"),
    (["run", "{b}/ds empty.yaml", *R], "variants[0].ds_config is empty; give the path of a DeepSpeed JSON file"),
    (["run", "{b}/ds inline.yaml", *R], "variants[0].ds_config must be the path of a DeepSpeed JSON file"),
    (
        ["run", "{b}/text short.yaml", *R],
        "Error: data.text_files hold 12 tokens: fewer than two blocks of seq_len + 1 = 33; add text or lower seq_len",
    ),
    *bad_run_folder_cases.CASES,
    (["bench", "kernels", "--numel", "inf"], "--numel 'inf' is not a whole number of elements from 1 to"),
    (["bench", "kernels", "--numel", "1.5"], "--numel '1.5' is not a whole number"),
    (["bench", "kernels", "--device", "tpu"], "'tpu' is not one of 'cuda', 'cpu'"),
    (["train", "--lr", "nan"], "'nan' is not a finite number above 0"),
    (["train", "--gpus", "5000"], "5000 is not in the range 1<=x<=1024"),
    (["train", "--micro-batch", "100000"], "100000 is not in the range 1<=x<=65536"),
    (["run", str(QUICKSTART), "--rdzv-endpoint", "node0:99999", *R], "PORT from 1 to 65,000"),
    (["run", str(QUICKSTART), "--rdzv-id", "../x", *R], "--rdzv-id '../x' is not a plain name"),
    (["run", str(QUICKSTART), "--simulate-ranks", "5000", *R], "5000 is not in the range 2<=x<=1024"),
    (["estimate", "--model", TINY, "--gpus", "2000"], "2000 is not in the range 1<=x<=1024"),
    (["run", "{b}/pretrained no config.yaml", *R], "has no config.json; pass a folder written by save_pretrained"),
    (["run", "{b}/no text files.yaml", *R], "data.text_files lists no file"),
    (["run", "{b}/text file folder.yaml", *R], "data.text_files: empty model is not a regular file"),
    (["run", str(QUICKSTART), "--gpus", "-1", *R], "see 'zbench run --help'"),
    (["run", str(QUICKSTART), "--variants", ",", *R], "names no variant"),
    (["run", str(QUICKSTART), "--no-such-flag", *R], "No such option"),
]
