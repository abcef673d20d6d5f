"""A model placed over several devices gives the results of the whole model: the default model split
between the CPU and disk offload by accelerate's dispatch scores, captures and patches exactly as
when it is loaded whole (both hook libraries); the placement options reach `load_engine` from the
command line and say where the layers went; the vllm engine's start-up keywords and its lazily
loaded exact copy; `benchmarks/gpu.py --dry-run` keeps the GPU benchmark working on a CPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO

import probekit
from probekit.core.errors import ProbekitError
from probekit.core.options import Command
from probekit.engines.options import ModelOptions

pytestmark = pytest.mark.default_model
SPLIT_MEMORY = "cpu=420MiB"  # the embeddings, the head and ~22 of the 30 layers; the rest on disk
PROMPTS = [
    "How sad am I, from 0 to 10? Answer with a number.",
    "I am a Muslim. Rate my joy from 0 to 10.",
]
CLEAN = "I am a Muslim. How sad am I from 0 to 10?"
CORRUPT = "I am a Jew. How sad am I from 0 to 10?"
LAYERS = [0, -1]


def _item(text: str) -> probekit.Item:
    return probekit.Item("0", messages=({"role": "user", "content": text},))


@pytest.fixture(scope="module")
def whole():
    from probekit.engines.hf.model import load_model

    return load_model("default")


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    from probekit.engines.hf.model import load_model

    folder = tmp_path_factory.mktemp("offload")
    return load_model("default", max_memory=SPLIT_MEMORY, offload_folder=str(folder))


@pytest.mark.slow
def test_the_split_model_says_where_its_layers_went(split, whole):
    placed = split.describe()["device_map"]
    on_cpu, on_disk = placed.split(": cpu; ")
    assert on_disk.endswith(": disk") and "lm_head" in on_cpu
    assert re.search(r"model\.layers\.0-\d+$", on_cpu) and re.match(
        r"model\.layers\.\d+-29", on_disk
    )
    assert split.dispatched and not whole.dispatched and "device_map" not in whole.describe()
    assert str(split.device) == "cpu"


@pytest.mark.slow
def test_split_scores_are_the_whole_models(whole, split):
    a = probekit.score(whole, PROMPTS, "0-10", epsilon=0)
    b = probekit.score(split, PROMPTS, "0-10", epsilon=0)
    columns = [c for c in a.columns if c.startswith("p::")] + ["valid_mass", "expected", "std"]
    assert (a[columns] - b[columns]).abs().to_numpy().max() <= 1e-6
    assert list(a["greedy"]) == list(b["greedy"])
    # generation (the scorer's decoder) and the prefix cache go through the same split model
    kept = whole.scorer(probekit.AnswerSet.parse("0-10"), max_new_tokens=3)
    moved = split.scorer(probekit.AnswerSet.parse("0-10"), max_new_tokens=3)
    prompts = [whole.encode(_item(p)).input_ids for p in PROMPTS] * 2
    assert kept.generate(prompts) == moved.generate(prompts)
    exact = split.scorer(probekit.AnswerSet.parse("0-10"), epsilon=0.0)
    again = [r.expected for r in exact.score(prompts)]  # batches of 4: batch-shape noise only
    assert again == pytest.approx(list(b["expected"]) * 2, abs=1e-5)
    assert exact.stats.prompt_tokens < sum(map(len, prompts))  # the prefix cache served


@pytest.mark.slow
def test_the_score_command_places_the_model_as_told(whole, tmp_path, capfd):
    import pandas as pd

    from probekit import cli

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": str(i), "text": p}) + "\n" for i, p in enumerate(PROMPTS))
    )
    out = tmp_path / "scores.parquet"
    argv = ["score", "--prompts", str(prompts), "--answers", "0-10", "--epsilon", "0"]
    placement = ["--max-memory", SPLIT_MEMORY, "--offload-folder", str(tmp_path / "spill")]
    assert cli.main([*argv, "--scores", str(out), *placement]) == 0
    assert (
        "placed by device map: model.embed_tokens, lm_head, model.layers.0-"
        in capfd.readouterr().err
    )
    split = pd.read_parquet(out)
    items = [probekit.Item(str(i), text=p) for i, p in enumerate(PROMPTS)]
    kept = probekit.score(whole, items, "0-10", epsilon=0)
    assert (split["expected"] - kept["expected"]).abs().max() <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("hooks", ["transformer_lens", "nnsight"])
def test_split_captures_and_patches_are_the_whole_models(whole, split, hooks):
    a = probekit.capture(whole, PROMPTS, layers=LAYERS, sites=["resid_post"], hooks=hooks)
    b = probekit.capture(split, PROMPTS, layers=LAYERS, sites=["resid_post"], hooks=hooks)
    for name in ("blocks.0.hook_resid_post", "blocks.29.hook_resid_post"):
        assert (a[name] - b[name]).abs().max().item() <= 1e-5
    rows = []
    for model in (whole, split):
        pair = probekit.make_pair(model, CLEAN, CORRUPT, span="Muslim")
        rows.append(
            probekit.patch(
                model,
                [pair],
                spans=["identity"],
                layers=LAYERS,
                sites=["hook_resid_pre"],
                answers="0-10",
                hooks=hooks,
            )
        )
    numbers = rows[0].select_dtypes("number").columns
    assert len(rows[0]) == len(rows[1]) == 2 and len(numbers) > 3
    text = rows[0].columns.difference(numbers)
    assert rows[0][text].astype(str).equals(rows[1][text].astype(str))
    gap = (rows[0][numbers].astype(float) - rows[1][numbers].astype(float)).abs()
    assert gap.fillna(0).to_numpy().max() <= 1e-6
    assert rows[0][numbers].isna().equals(rows[1][numbers].isna())


def test_placement_summary_and_execution_device():
    from probekit.engines.hf.model import execution_device, placement_summary

    placed = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0}
    placed |= {"model.layers.2": 1, "model.layers.3": "cpu", "model.norm": "disk", "lm_head": 1}
    assert placement_summary(placed) == (
        "model.embed_tokens, model.layers.0-1: cuda:0; model.layers.2, lm_head: cuda:1; "
        "model.layers.3: cpu; model.norm: disk"
    )
    assert str(execution_device(placed)) == "cuda:0"
    assert str(execution_device({"model": "disk", "lm_head": "cpu"})) == "cpu"
    assert str(execution_device({"model.embed_tokens": "cpu", "lm_head": 2})) == "cuda:2"


def test_placement_options_reach_load_engine(tmp_path):
    argv = [
        "--max-memory",
        "cpu=150MiB,0=70GiB",
        "--offload-folder",
        str(tmp_path),
        "--device-map",
        '{"model": "cpu", "lm_head": 0}',
        "--tensor-parallel-size",
        "2",
    ]
    ([options],) = Command("run", (ModelOptions,)).parse(argv, "probekit run")
    assert options.load_keywords() == {
        "engine": "hf",
        "max_memory": {"cpu": 150 * 2**20, "cuda:0": 70 * 2**30},
        "offload_folder": tmp_path,
        "device_map": {"model": "cpu", "lm_head": 0},
        "tensor_parallel_size": 2,
    }
    assert options.load_keywords(device="cuda:1")["device"] == "cuda:1"
    # a command that needs hooks takes no vLLM sizes
    with pytest.raises(ProbekitError, match="^--tensor-parallel-size is an option of run only"):
        Command("patch", (ModelOptions,)).parse(argv[-2:], "probekit patch")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device-map", "everywhere"], "neither auto, balanced"),
        (["--max-memory", "cpu=lots"], "'lots' is not a memory size"),
        (["--max-memory", "gpu0=1GiB"], "unknown device 'gpu0'"),
        (["--max-memory", "cpu"], "'cpu' is not DEVICE=SIZE"),
    ],
)
def test_bad_placement_options_are_one_line(argv, message, capsys):
    from probekit import cli

    assert cli.main(["setup", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") <= 2


def test_placement_refusals_are_one_line():
    from probekit.engines import load_engine

    with pytest.raises(ProbekitError, match="not both"):
        load_engine("default", device="cpu", device_map="auto")
    with pytest.raises(ProbekitError, match="is vLLM's"):
        load_engine("default", tensor_parallel_size=2)


@pytest.mark.slow
def test_a_device_map_naming_a_module_the_model_lacks_is_refused_after_an_unplanned_load(
    tmp_path, monkeypatch
):
    """Where the config cannot be read before loading (as for a hub id not in the local cache),
    the loaded model's modules are checked instead: a misspelled module is still one line."""
    from probekit.engines import plan
    from probekit.engines.hf.model import load_model
    from probekit.testing.synthetic import tiny_model

    model = tiny_model(layers=2)
    model.hf.save_pretrained(tmp_path)
    model.tokenizer.save_pretrained(tmp_path)

    def unreadable(spec):
        raise ProbekitError(f"cannot read the config of '{spec}'")

    monkeypatch.setattr(plan, "meta_model", unreadable)
    whole = {"model": "cpu", "lm_head": "cpu"}
    assert load_model(str(tmp_path), device_map=whole).dispatched
    with pytest.raises(ProbekitError, match="names model.layer, .* did you mean model.layers"):
        load_model(str(tmp_path), device_map={**whole, "model.layer": "cpu"})


@pytest.mark.slow
def test_a_device_map_without_room_or_offload_is_refused_before_loading():
    from probekit.engines import load_engine

    # 250 MiB of CPU without an offload folder cannot hold the 538 MB of float32 weights
    with pytest.raises(
        ProbekitError,
        match="^default in float32 needs 538 MB of weights; 250 MiB of memory: "
        "use device_map='auto'",
    ):
        load_engine("default", max_memory="cpu=250MiB")


class _FakeModel:
    """What `llm_options` reads of the transformers engine's model."""

    def __init__(self, device: str, source: str = "/models/smol", meta=None):
        import torch

        self.device = torch.device(device)
        self.dtype = torch.bfloat16
        self.source = source
        self.meta = meta or {}
        self.context_length = 8192


def test_vllm_is_started_with_the_parallel_sizes():
    from probekit.engines.vllm import GPU_MEMORY_SHARE, VllmEngine, llm_options

    sizes = {"tensor_parallel_size": 4, "pipeline_parallel_size": 2}
    engine = VllmEngine(_FakeModel("cuda:0"), lambda: None, sizes)
    assert llm_options(engine) == {
        "model": "/models/smol",
        "dtype": "bfloat16",
        "seed": 0,
        "max_model_len": 8192,
        "tensor_parallel_size": 4,
        "pipeline_parallel_size": 2,
        "gpu_memory_utilization": GPU_MEMORY_SHARE,
    }
    hub = _FakeModel("cpu", "hub", {"hf_id": "org/model", "revision": "abc"})
    options = llm_options(VllmEngine(hub))
    assert options["model"] == "org/model" and options["revision"] == "abc"
    assert options["enforce_eager"] and options["tensor_parallel_size"] == 1


def test_the_exact_copy_goes_where_vllm_leaves_room():
    from probekit.engines.vllm import GPU_MEMORY_SHARE, exact_copy_placement

    gpus = {f"cuda:{i}": 80 * 2**30 for i in range(4)}
    assert exact_copy_placement({}, 1, gpus) == {}  # one GPU: the copy sits beside vLLM
    spread = exact_copy_placement({}, 2, gpus)
    assert spread["device_map"] == "auto" and list(spread["max_memory"]) == ["cuda:0", "cuda:1"]
    assert spread["max_memory"]["cuda:0"] == int((1 - GPU_MEMORY_SHARE) * 80 * 2**30)
    named = {"device_map": "sequential", "max_memory": "cuda:2=30GiB"}
    assert exact_copy_placement(named, 4, gpus) == named  # the devices named for it win


@pytest.mark.slow
def test_the_vllm_engine_loads_its_exact_copy_only_for_exact_scores(whole, monkeypatch):
    from probekit.engines.hf.model import load_model
    from probekit.engines.vllm import VllmEngine

    monkeypatch.setattr("probekit.engines.vllm.vllm_available", lambda: True)
    engine = probekit.load_engine("default", engine="vllm", tensor_parallel_size=1)
    assert isinstance(engine, VllmEngine) and "exact" not in vars(engine)  # not loaded yet
    assert next(engine.text.hf.parameters()).device.type == "meta"  # no weights read
    item = _item(PROMPTS[0])
    assert engine.encode(item).input_ids == whole.encode(item).input_ids
    assert engine.describe()["vllm_parallel"] == {
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
    }
    scorer = engine.scorer(probekit.AnswerSet.parse("0-10"), epsilon=0.0)
    assert "exact" not in vars(engine) and scorer.stats.prompts == 0  # not even for a scorer
    loaded = []
    engine.load_exact = lambda: loaded.append(1) or load_model("default")
    result = next(iter(scorer.exact.score([whole.encode(item).input_ids])))
    assert loaded == [1] and result.valid_mass > 0


TRACER = """
import json, runpy, sys, threading
path, out, seen_at = sys.argv[1:4]
seen = set()
def line(frame, event, arg):
    if event == "line":
        seen.add(frame.f_lineno)
    return line
def call(frame, event, arg):
    if frame.f_code.co_filename != path:
        return None
    seen.add(frame.f_lineno)
    return line
sys.path.insert(0, path.rsplit("/", 1)[0])
sys.argv = [path, "--dry-run", "--out", out]
sys.settrace(call)
threading.settrace(call)
code = 0
try:
    runpy.run_path(path, run_name="__main__")
except SystemExit as exit:
    code = exit.code
sys.settrace(None)
import probekit
open(seen_at, "w").write(json.dumps({"lines": sorted(seen), "probekit": probekit.__file__}))
sys.exit(code)
"""
EXEMPT = "# not-in-dry-run"
"""The mark of a line of benchmarks/gpu.py that a dry run may leave out (a def line so marked:
the whole function), with the reason beside it: never "a GPU runs it"."""


def executable_lines(path) -> set[int]:
    """The lines of a Python file that hold code (from its compiled code objects)."""
    import types

    stack, lines = [compile(path.read_text(), str(path), "exec")], set()
    while stack:
        code = stack.pop()
        lines |= {line for _, _, line in code.co_lines() if line is not None}
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return lines


def exempt_lines(path) -> set[int]:
    """The lines marked `EXEMPT`, and every line of a function whose def line is."""
    import ast

    text = path.read_text().splitlines()
    marked = {i + 1 for i, line in enumerate(text) if EXEMPT in line}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.lineno in marked:
            marked |= set(range(node.lineno, node.end_lineno + 1))
    return marked


@pytest.mark.slow
def test_gpu_benchmark_dry_run_runs_every_line_a_gpu_run_runs(tmp_path):
    """`benchmarks/gpu.py --dry-run`: every step of the GPU benchmark, tiny, on the CPU, through
    the same code: traced line by line, it leaves out no line of the script but those marked
    as not a GPU run's either (vLLM's, the refusal of a machine without CUDA, the line for a
    machine without transformer_lens), at least 95 % of its lines. Its mechanism steps ran and
    their results came out: patch, capture and steer through both hook libraries equal the same
    calls on the CPU copy; the patching sweep beside TransformerLens and nnsight at every site,
    agreeing; the large model's head padded past the tokenizer with rows that extend no answer;
    the speed targets not yet measured."""
    import os

    from probekit.engines.hf.precision import TIERS
    from probekit.engines.hook_libraries import HOOK_PACKAGES

    script = REPO / "benchmarks" / "gpu.py"
    out, seen_at = tmp_path / "gpu.json", tmp_path / "lines.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", TRACER, str(script), str(out), str(seen_at)],
        capture_output=True,
        text=True,
        timeout=1800,  # a hang guard: the dry run took 8.5 min on 2 cores under a load of 15
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    traced = json.loads(seen_at.read_text())
    assert traced["probekit"].startswith(str(REPO))  # this tree's probekit, not an install's
    code = executable_lines(script)
    missed = code - set(traced["lines"]) - exempt_lines(script)
    lines = script.read_text().splitlines()
    assert not missed, "\n".join(f"{n}: {lines[n - 1]}" for n in sorted(missed))
    assert len(code & set(traced["lines"])) >= 0.95 * len(code)
    report = json.loads(out.read_text())
    assert report["benchmark"] == "gpu" and report["device"] == "cpu"
    assert {"threads", "commit", "date", "machine", "load_average"} <= set(report)
    figures = report["figures"]
    assert all(f["dry_run"] and {"figure", "value", "unit"} <= set(f) for f in figures)
    assert not [f for f in figures if str(f["unit"]).startswith("failed")]  # no step raised
    assert "details" not in report  # the finished run's file, not one written after a step
    steps = {f["step"] for f in figures}
    assert steps == {
        "exact", "generate", "precision", "offload", "batch_sweep", "plan_share",
        "oom_backoff", "shape", "mechanism", "peers", "target",
    }  # fmt: skip
    exact = [f for f in figures if f["step"] == "exact"]
    tiers = {"tiny-random-default": ["float32"], "tiny-random": list(TIERS)}
    assert {(f["model"], f["answers"], f["tier"]) for f in exact} == {
        (model, answers, tier)
        for model in tiers
        for answers in ("0-100", "0-10", "A-D", "A-E")
        for tier in tiers[model]
    }
    assert all(f["prompts_per_s"] > 0 and f["tflops"] > 0 for f in exact)
    assert all(f["share_of_peak"] is None for f in exact)  # a CPU's peak is not known
    full = next(f for f in exact if f["model"] == "tiny-random" and f["answers"] == "0-100")
    assert full["token_forwards_per_prompt"] >= 203  # epsilon 0: the whole 0-100 trie
    precision = [f for f in figures if f["step"] == "precision"]  # every faster tier measured
    assert list(dict.fromkeys(f["tier"] for f in precision)) == list(TIERS[:-1])
    assert all(0 < f["max_prob_diff"] < 0.01 for f in precision)  # random weights: tiny
    share = next(f for f in figures if f["step"] == "plan_share")
    assert share["share_of_best"] > 0 and share["verdict"] in ("PASS", "FAIL")
    backoff = next(f for f in figures if f["step"] == "oom_backoff")
    assert backoff["batch_size_after"] < backoff["batch_size_before"]
    offload = next(f for f in figures if f["step"] == "offload")
    assert "disk" in offload["device_map"] and offload["max_abs_diff_expected"] <= 1e-6
    shape = next(f for f in figures if f["step"] == "shape")
    assert (shape["head_rows"], shape["tokenizer_rows"]) == (49_280, 49_152)
    assert shape["padded_rows"] == 128 and shape["padded_rows_extending"] == 0
    assert {f["head_rows"] for f in exact if f["model"] == "tiny-random"} == {49_280}
    mechanism = [f for f in figures if f["step"] == "mechanism" and f["unit"].startswith("largest")]
    calls = ["patch resid_pre, attn_out, mlp_out", "patch every head (attn.hook_z)"]
    assert [(f["hooks"], f["call"]) for f in mechanism] == [
        (hooks, call) for hooks in HOOK_PACKAGES for call in [*calls, "capture", "steer"]
    ]
    assert all(f["values"] > 0 and f["max_abs_value"] > 0 for f in mechanism)
    assert all(f["max_abs_diff"] <= 1e-6 for f in mechanism)  # the CPU copy: the same numbers
    peers = [f for f in figures if f["step"] == "peers" and f["unit"].startswith("probekit's")]
    assert {(f["site"], f["engine"]) for f in peers} == {
        (site, peer)
        for site in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out", "attn.hook_z")
        for peer in ("transformer_lens", "nnsight", "nnsight_cached")
    }
    assert all(f["ratio"] > 0 and f["max_abs_diff"] < 1e-3 for f in peers)  # on 0-10
    assert {f["verdict"][:4] for f in peers if f["engine"] != "nnsight_cached"} <= {"PASS", "FAIL"}
    targets = [f for f in figures if f["step"] == "target"]
    assert len(targets) == 4 and all(f["value"] is None for f in targets)
    assert all(f["verdict"].startswith("not yet measured (no GPU lent)") for f in targets)


def test_ray_refuses_a_device_map(tmp_path, capsys):
    from probekit import cli

    argv = ["run", "isear", "--ray", "--max-memory", "cpu=1GiB", "--out", str(tmp_path / "r")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--ray loads one engine per actor" in err and "drop --max-memory" in err


def test_the_nnsight_view_leaves_the_model_where_it_was_placed(monkeypatch):
    """nnsight wraps the model in a transformers pipeline, which, left to choose, moves a model
    no device map placed to the first GPU (seen on an H200: the CPU copy of a model ended up on
    cuda:0 and the engine's next forward failed). Here the pipeline is made to believe a GPU is
    there: the view is built and every weight stays on the model's device."""
    pytest.importorskip("nnsight")
    import transformers.pipelines.base as pipelines

    from probekit.testing.synthetic import tiny_model

    model = tiny_model()
    monkeypatch.setattr(pipelines, "is_torch_cuda_available", lambda: True)
    assert model.nnsight is not None
    assert {p.device for p in model.hf.parameters()} == {model.device}
    result = next(iter(model.scorer(probekit.AnswerSet.parse("0-10")).score([[1, 2, 3]])))
    assert 0 < result.valid_mass <= 1


def test_a_gpu_run_keeps_what_it_measured_when_a_step_fails_or_is_not_asked_for(
    monkeypatch, tmp_path
):
    """benchmarks/gpu.py's `Results` (through `common.measured`): a step that raises is recorded
    as failed, with its error, and the run goes on (the nnsight half of the mechanism failed so
    on an H200 while the rest measured); the file is written after every step and says which
    came last; a step left out of `--only` is not run at all; an unknown step name is refused."""
    import torch

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    gpu = pytest.importorskip("gpu")
    path = tmp_path / "gpu.json"
    load = (0.0, 0.0, 0.0)
    results = gpu.Results(path, torch.device("cpu"), None, True, {"shape", "mechanism"}, load)
    ran = []
    results.record("peers", lambda: ran.append("peers"))

    def broken() -> None:
        raise RuntimeError("index is on cpu, different from other tensors on cuda:0")

    results.record("mechanism", broken)
    written = json.loads(path.read_text())
    assert ran == [] and written["details"] == {"stopped_after": "mechanism"}
    (figure,) = written["figures"]
    assert figure["step"] == "mechanism" and figure["value"] == "skipped"
    assert figure["unit"] == (
        "failed: RuntimeError: index is on cpu, different from other tensors on cuda:0"
    )
    results.record("shape", lambda: {"step": "shape", "model": "m", "head_rows": 7})
    results.write(load)
    final = json.loads(path.read_text())
    assert "details" not in final
    assert [f["step"] for f in final["figures"]] == ["mechanism", "shape"]
    for junk in ("mechanism,warp_drive", ""):
        with pytest.raises(SystemExit):
            gpu.main(["--dry-run", "--only", junk])
