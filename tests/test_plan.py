"""The memory plan: Llama-3.1-8B- and 70B-shaped config.json files (no weights) get the right
weights, KV cache, dtype, batch and placement; several devices get the first placement that fits;
what cannot fit is refused in one line that names the options that would (`probekit plan` exits
2 with it), saying so when the weights fit and the batch or the prompt does not; and the exact
scorer's batch on a GPU is the plan's, counted in tokens (fake device sizes: no GPU needed)."""

from __future__ import annotations

import json
import re

import pytest

import probekit
from probekit.core.errors import ProbekitError
from probekit.engines.devices import (
    dispatch_options,
    format_size,
    parse_device_map,
    parse_devices,
    parse_size,
)
from probekit.engines.plan import MAX_BATCH, batch_for, check_before_load, prompt_bytes, read_shape

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}
SHAPES = {
    "Llama-3.1-8B": dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_hidden_layers=32
    ),
    "Llama-3.1-70B": dict(
        hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_hidden_layers=80
    ),
}
GPU = "cuda:0=80GiB"


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """name -> the folder of a hub-style config.json of that shape (no weights)."""
    root = tmp_path_factory.mktemp("configs")
    folders = {}
    for name, shape in SHAPES.items():
        folder = root / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**LLAMA, **shape}))
        folders[name] = folder
    return folders


def test_llama_8b_weights_and_kv_cache(configs):
    plan = probekit.plan(str(configs["Llama-3.1-8B"]), GPU, dtype="bfloat16")
    assert isinstance(plan, probekit.MemoryPlan) and plan.model == "Llama-3.1-8B"
    assert plan.parameters == 8_030_261_248  # Llama-3.1-8B's published count
    assert plan.weights == 2 * plan.parameters and format_size(plan.weights) == "16 GB"
    # 2 (K, V) x 32 layers x 8 heads x 128 wide x 2 bytes = 128 KiB a token
    assert plan.kv_cache == plan.batch_size * plan.prompt_tokens * 131072
    # a prompt of 512 tokens: 512 x (128 KiB + 90 KB of activations) + 1.5 MB of logits = 115
    # MB; 0.9 x 80 GiB - 16 GB leaves 61 GB: 533 prompts, the plan's power of two is 512
    assert plan.fits and plan.placement == "cuda:0" and plan.batch_size == 512
    assert plan.advice == ""


def test_the_policy_picks_float32_where_it_fits_in_half_the_memory(configs):
    eight = str(configs["Llama-3.1-8B"])
    assert probekit.plan(eight, GPU).dtype == "float32"  # 32 GB <= 40 GiB
    assert probekit.plan(eight, "cuda:0=48GiB").dtype == "bfloat16"  # 32 GB > 24 GiB
    assert probekit.plan(eight, "cpu=64GiB").dtype == "float32"  # the CPU: always float32


def test_llama_70b_on_one_gpu_is_refused_in_one_line(configs):
    path = str(configs["Llama-3.1-70B"] / "config.json")  # just its config.json
    plan = probekit.plan(path, GPU)
    assert plan.dtype == "bfloat16" and format_size(plan.weights) == "141 GB"
    assert not plan.fits and plan.batch_size == 0 and plan.placement == ""
    assert plan.advice == (
        "Llama-3.1-70B in bfloat16 needs 141 GB of weights; one 80 GiB GPU: use "
        "device_map='auto' with max_memory and offload_folder, or engine='vllm', "
        "tensor_parallel_size=2"
    )


def test_llama_70b_placements_that_fit(configs, capsys):
    seventy = str(configs["Llama-3.1-70B"])
    two = probekit.plan(seventy, "cuda:0=80GiB,cuda:1=80GiB", dispatched=True)
    assert two.fits and two.placement == "device_map over cuda:0, cuda:1"
    offload = probekit.plan(seventy, "cuda:0=80GiB,cpu=200GiB", dispatched=True)
    assert offload.fits and offload.placement.startswith("device_map with 64 GB offloaded")
    assert not probekit.plan(seventy, "cuda:0=80GiB,cpu=32GiB", dispatched=True).fits
    disk = probekit.plan(seventy, "cuda:0=80GiB,cpu=32GiB", dispatched=True, offload=True)
    assert disk.fits and "disk" in disk.placement
    from probekit import cli

    argv = ["plan", "--model", seventy, "--devices", "cuda:0=80GiB,cpu=200GiB", "--dispatched"]
    assert cli.main(argv) == 0
    assert "placement: --device-map with 64 GB offloaded" in capsys.readouterr().out
    vllm = probekit.plan(seventy, "cuda:0=80GiB,cuda:1=80GiB", tensor_parallel_size=2)
    assert vllm.fits and vllm.placement == "vLLM tensor parallel over 2 GPUs"
    assert not probekit.plan(seventy, GPU, tensor_parallel_size=2).fits  # one GPU given


def test_plan_command(configs, capsys):
    from probekit import cli

    eight = str(configs["Llama-3.1-8B"])
    assert cli.main(["plan", "--model", eight, "--devices", GPU, "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "weights: 16 GB" in out and "placement: cuda:0" in out and "dtype: bfloat16" in out
    assert cli.main(["plan", "--model", eight, "--devices", GPU, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "float32"
    seventy = str(configs["Llama-3.1-70B"] / "config.json")
    assert cli.main(["plan", "--model", seventy, "--devices", GPU]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("probekit: error: Llama-3.1-70B in bfloat16 needs 141 GB of weights")
    assert "use --device-map auto with --max-memory and --offload-folder, or --engine vllm" in err
    assert "\n" not in err
    assert cli.main(["plan", "--model", seventy, "--devices", "cuda:0=80"]) == 2
    assert "'80' is not a memory size" not in capsys.readouterr().err  # bytes: parsed, too small


@pytest.mark.parametrize(
    "model, message",
    [
        ("/no/such/folder", "cannot read the config"),
        ("{config}", "not a transformers config.json"),
    ],
)
def test_unreadable_models_are_one_line(tmp_path, model, message):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 3}))
    with pytest.raises(ProbekitError, match=message):
        probekit.plan(model.format(config=bad), GPU)


def test_sizes_and_devices():
    assert parse_size("80GiB") == 80 * 2**30 and parse_size("16GB") == 16 * 10**9
    assert parse_size("1.5 MiB") == int(1.5 * 2**20) and parse_size("4096") == 4096
    assert parse_devices("cuda=1GiB, 1=2GiB,cpu=3MB") == {
        "cuda:0": 2**30,
        "cuda:1": 2**31,
        "cpu": 3 * 10**6,
    }
    assert parse_devices({"cpu": "1KiB"}) == {"cpu": 1024}
    for bad, message in [
        ("cuda:0=80XB", "not a memory size"),
        ("tpu=1GiB", "unknown device 'tpu'"),
        ("", "no devices given"),
    ]:
        with pytest.raises(ProbekitError, match=message):
            parse_devices(bad)
    assert format_size(80 * 2**30, binary=True) == "80 GiB" and format_size(1.5e9) == "1.5 GB"


def test_device_maps_and_dispatch_options(tmp_path):
    assert parse_device_map("balanced") == "balanced"
    mapping = parse_device_map('{"model": "cuda", "lm_head": "disk", "x": 1}')
    assert mapping == {"model": "cuda:0", "lm_head": "disk", "x": 1}
    saved = tmp_path / "map.json"
    saved.write_text(json.dumps({"model": "cpu"}))
    assert parse_device_map(str(saved)) == {"model": "cpu"}
    with pytest.raises(ProbekitError, match="neither auto"):
        parse_device_map("[1, 2]")
    assert dispatch_options() is None
    folder = tmp_path / "spill"
    options = dispatch_options(max_memory="cuda:1=2GiB,cpu=1GiB", offload_folder=folder)
    assert options == {
        "device_map": "auto",
        "max_memory": {1: 2 * 2**30, "cpu": 2**30},
        "offload_folder": str(folder),
    }
    assert folder.is_dir()


def test_the_load_check_runs_only_for_accelerators_and_device_maps(configs):
    seventy = str(configs["Llama-3.1-70B"])
    assert check_before_load(seventy, device="cpu") is None  # the CPU: nothing to plan
    with pytest.raises(
        ProbekitError,
        match="in float32 needs 282 GB of weights; 1.0 GiB of memory: use device_map=",
    ):
        check_before_load(seventy, device_map="auto", max_memory="cpu=1GiB")
    plan = check_before_load(seventy, max_memory="cpu=16GiB", offload_folder="/tmp")
    assert plan is not None and plan.fits and "disk" in plan.placement
    assert check_before_load("org/not-in-the-cache", max_memory="cpu=1GiB") is None


GiB = 2**30
TRIE_0_100 = 203  # answer positions of the 0-100 trie with the default model's tokenizer


def test_llama_70b_over_two_gpus_gets_a_placement_without_asking(configs):
    seventy = str(configs["Llama-3.1-70B"])
    two = probekit.plan(seventy, "cuda:0=80GiB,cuda:1=80GiB")  # no placement named
    assert two.fits and two.dtype == "bfloat16"
    assert two.placement == "device_map over cuda:0, cuda:1" and two.batch_size == 32
    assert two.tried == [
        "cuda:0: the weights do not fit",
        "device_map over cuda:0, cuda:1: fits, batch 32",
    ]
    assert "tried: cuda:0: the weights do not fit" in two.lines()
    offload = probekit.plan(seventy, "cuda:0=80GiB,cpu=200GiB")
    assert offload.fits and offload.placement.startswith("device_map with 64 GB offloaded")
    eight = probekit.plan(str(configs["Llama-3.1-8B"]), "cuda:0=80GiB,cuda:1=80GiB")
    assert eight.placement == "cuda:0" and eight.tried == ["cuda:0: fits, batch 128"]
    assert "the whole model fits on the first device; the others stay idle" in eight.notes
    # 70B in float32 (282 GB) over four 80 GiB GPUs (309 GB usable): the map over the four
    four = ",".join(f"cuda:{i}=80GiB" for i in range(4))
    wide = probekit.plan(seventy, four, dtype="float32")
    assert wide.placement == "device_map over cuda:0, cuda:1, cuda:2, cuda:3"
    nothing = probekit.plan(seventy, "cuda:0=40GiB,cuda:1=40GiB,cpu=16GiB")
    assert not nothing.fits and nothing.advice.startswith("Llama-3.1-70B in bfloat16 needs 141 GB")
    assert [t.split(": ")[1] for t in nothing.tried] == ["the weights do not fit"] * 4


def test_a_plan_that_fails_for_the_batch_or_the_prompt_says_so(configs):
    eight = str(configs["Llama-3.1-8B"])
    big = probekit.plan(eight, GPU, dtype="bf16", batch_size=2048)
    assert not big.fits and big.advice == (
        "Llama-3.1-8B in bfloat16: the weights fit (cuda:0), but a batch of 2048 prompts of 512 "
        "tokens needs 235 GB beside them and 61 GB is left: use batch_size=512 or less"
    )
    long = probekit.plan(eight, GPU, dtype="bf16", prompt_tokens=1_000_000)
    assert not long.fits and "weights fit (cuda:0), but one prompt of 1000000 tokens" in long.advice
    assert long.advice.endswith("plan prompts of at most 276906 tokens (prompt_tokens)")
    assert "needs 16 GB of weights" not in long.advice  # the weights are not blamed
    from probekit import cli

    argv = ["plan", "--model", eight, "--devices", GPU, "--dtype", "bf16", "--batch-size", "2048"]
    assert cli.main(argv) == 2
    with pytest.raises(ProbekitError, match=r"prompt_tokens must be at least 1 \(got 0\)"):
        probekit.plan(eight, GPU, prompt_tokens=0)


def test_the_scorer_batch_is_the_plans_counted_in_tokens(configs):
    """The batch the exact scorer starts from on a GPU holding the whole model: the largest power
    of two (at most MAX_BATCH) whose prompts, each its prompt tokens plus the answer trie, fit
    beside the weights in 90% of the device."""
    eight = read_shape(str(configs["Llama-3.1-8B"]))
    seventy = read_shape(str(configs["Llama-3.1-70B"]))
    tokens = 66 + TRIE_0_100  # the H100 run's mean prompt, the 0-100 trie
    # 8B in bfloat16 on 80 GiB: 61 MB a prompt, 61 GB beside the weights -> 1004 -> 512 (the
    # H100 run's best measured batch); float32 halves it; longer prompts, smaller batches
    assert prompt_bytes(eight, "bfloat16", tokens) == 61_037_568
    assert batch_for(eight, "bfloat16", 80 * GiB, tokens) == 512
    assert batch_for(eight, "float32", 80 * GiB, tokens) == 256
    assert batch_for(eight, "bfloat16", 80 * GiB, 4096) == 64
    assert batch_for(eight, "bfloat16", 141 * GiB, tokens) == 1024  # an H200
    assert batch_for(eight, "bfloat16", 24 * GiB, tokens) == 64
    # 70B in bfloat16 on one H200: 141 GB of weights in 127 GiB usable: nothing fits, the
    # scorer still starts from 1 (the load check refuses such a load before)
    assert batch_for(seventy, "bfloat16", 141 * GiB, tokens) == 1
    assert batch_for(seventy, "bfloat16", 192 * GiB, tokens) == 256


@pytest.mark.default_model
def test_the_default_models_batch_fills_a_gpu_up_to_the_largest(tmp_path):
    """The default model's shape, from its config read out of its GGUF (no conversion)."""
    from probekit.testing.synthetic import default_config

    default_config().to_json_file(tmp_path / "config.json")
    default = read_shape(str(tmp_path / "config.json"))
    assert batch_for(default, "float32", 80 * GiB, 66 + TRIE_0_100) == MAX_BATCH == 2048
    assert batch_for(default, "float32", 8 * GiB, 66 + TRIE_0_100) == 256
    assert batch_for(default, "float32", 80 * GiB, 4096) == 256


def test_the_scorer_plans_from_the_models_shape_and_the_devices_memory(configs, monkeypatch):
    """`planned_batch` on a model on CUDA (built on the meta device: no GPU, no weights) with a
    fake 80 GiB device: the plan's batch; on a CPU 16; dispatched by a device map 64."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from probekit.engines.hf import scorer
    from probekit.engines.hf.model import LoadedModel

    config = AutoConfig.from_pretrained(str(configs["Llama-3.1-8B"]))
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model = LoadedModel(hf, None, "8b", "random", torch.device("cuda"), torch.bfloat16)
    monkeypatch.setattr(scorer, "device_memory", lambda device: 80 * GiB)
    assert scorer.planned_batch(model, 66 + TRIE_0_100) == 512
    monkeypatch.setattr(scorer, "device_memory", lambda device: 24 * GiB)
    assert scorer.planned_batch(model, 66 + TRIE_0_100) == 64
    model.meta["device_map"] = "model.layers.0-15: cuda:0; model.layers.16-31: cuda:1"
    assert scorer.planned_batch(model, 66 + TRIE_0_100) == scorer.DISPATCHED_BATCH == 64
    model.device = torch.device("cpu")
    assert scorer.planned_batch(model, 66 + TRIE_0_100) == scorer.CPU_BATCH == 16


def test_a_plan_that_fits_no_batch_says_so_and_what_would(configs, capsys):
    """Three GPUs whose device map holds the 8B weights with 77 MB to spare: no prompt of 512
    tokens fits beside them. The batch line says none fits (never "none prompts"), the error is
    one line with the prompt length that would fit, and a plan for that length fits."""
    from probekit import cli

    eight = str(configs["Llama-3.1-8B"])
    three = ",".join(f"cuda:{i}=5700MiB" for i in range(3))
    assert cli.main(["plan", "--model", eight, "--devices", three, "--dtype", "bf16"]) == 2
    out, err = capsys.readouterr()
    assert "batch: none fits (the figures below are of one prompt of 512 tokens)" in out
    assert "none prompts" not in out and "placement: does not fit" in out
    assert err.count("\n") == 1 and "the weights fit (--device-map over cuda:0, cuda:1" in err
    longest = int(err.rsplit("at most ", 1)[1].split()[0])
    assert 0 < longest < 512
    fitting = probekit.plan(eight, three, dtype="bf16", prompt_tokens=longest)
    assert fitting.fits and fitting.batch_size == 1
    assert not probekit.plan(eight, three, dtype="bf16", prompt_tokens=longest + 1).fits


@pytest.mark.parametrize(
    "devices, message",
    [
        ("cuda:0=80GiB,cuda:0=40GiB", "cuda:0 is named twice; give each device one size"),
        ("cuda=80GiB,0=40GiB", "cuda:0 is named twice"),
        ({"cpu": "1GiB", " CPU": "2GiB"}, "cpu is named twice"),
        ("cuda:0=0GiB", "cuda:0: a memory size must be more than zero (got '0GiB')"),
        ("cpu=-1GiB", "cpu: a memory size must be more than zero (got '-1GiB')"),
        ({"cuda:1": 0}, "cuda:1: a memory size must be more than zero (got 0)"),
    ],
)
def test_devices_named_twice_or_without_memory_are_one_line(configs, devices, message, capsys):
    eight = str(configs["Llama-3.1-8B"])
    with pytest.raises(ProbekitError, match=f"^devices: {re.escape(message)}"):
        probekit.plan(eight, devices)
    with pytest.raises(ProbekitError, match=re.escape(message)):
        dispatch_options(max_memory=devices)
    if isinstance(devices, str):
        from probekit import cli

        assert cli.main(["plan", "--model", eight, "--devices", devices]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1


def test_a_device_map_is_checked_against_the_models_modules_before_loading(configs):
    """The module names of a device map, read against the model built on the meta device: a
    name the model lacks, with the nearest ones, and a module left without a device, are one
    line each, before any weight is read (here there are none to read)."""
    eight = str(configs["Llama-3.1-8B"])
    room = "cpu=64GiB"
    misspelled = {"model.embed_tokens": "cpu", "model.layer": "cpu", "model.norm": 0}
    with pytest.raises(ProbekitError, match="^the device map names model.layer, which Llama-3.1"):
        check_before_load(eight, device_map=misspelled, max_memory=room)
    with pytest.raises(ProbekitError, match="8B lacks; did you mean model.layers"):
        probekit.load_model(eight, device_map=json.dumps({**misspelled, "lm_head": "cpu"}))
    partial = {"model.layers": "cpu", "lm_head": "cpu"}
    with pytest.raises(
        ProbekitError,
        match="^the device map gives no device to model.embed_tokens, model.norm of Llama-3.1-8B",
    ):
        check_before_load(eight, device_map=partial, max_memory=room)
    whole = {"model": "cpu", "lm_head": "cpu"}
    assert check_before_load(eight, device_map=whole, max_memory=room).fits
    assert check_before_load(eight, device_map={"": "cpu"}, max_memory=room).fits
