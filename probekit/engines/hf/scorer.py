"""Exact answer probabilities from logits: one prompt pass, then the answer trie from its KV cache.

`HFScorer` is the transformers engine's scorer (`probekit.engines.base.Scorer`), a facade over one
module per pass, and the batches it feeds them:
- batches: the batch size (on CUDA the memory plan's, for the longest prompt of each window plus
  the answer trie; `planned_batch`), length-sorted batches that share prefixes (`run_batched`),
  halved on CUDA out-of-memory (`run_batched`);
- `prompt_pass`: prompts that share a token prefix (the same persona system prompt, the same
  template head) compute it once at batch size 1 and reuse its KV cache; the rest is
  left-padded, and the LM head runs on the last position only; in generate mode the decoding
  of a continuation continues from the same pass;
- `trie_pass`: one forward per trie depth over every prompt's kept nodes, pruned so that the
  dropped mass relative to the valid mass (`error_bound`) stays within `epsilon`, nothing read
  from the device inside its levels; a prompt the learned widths cut runs again with its own,
  and one whose bound still exceeds `epsilon` (the budget is set against an upper bound of its
  valid mass) is re-expanded exactly, so every reported bound is at most `epsilon`;
- `head`: the LM head and the float64-accurate vocabulary sums; `cache`: the KV-cache operations.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from numbers import Integral
from typing import Any

import torch

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.public import public
from probekit.engines.base import HookableModel, ScoreResult, ScorerStats, windows
from probekit.engines.devices import device_memory
from probekit.engines.hf import cache as kv
from probekit.engines.hf import differentiable
from probekit.engines.hf.forward import clock
from probekit.engines.hf.precision import fall_back, overflowed
from probekit.engines.hf.prompt_pass import PrefixCache, PromptState, decode, prompt_pass
from probekit.engines.hf.trie_pass import AnswerContext, TriePass
from probekit.engines.options import ScorerOptions, dtype_name
from probekit.engines.plan import batch_for, shape_of
from probekit.engines.trie import AnswerTrie

CPU_BATCH = 16
"""Prompts a batch on a CPU or MPS, where the memory plan has no device size to fill (the
scorer's default there since its first version)."""
DISPATCHED_BATCH = 64
"""Prompts a batch of a model dispatched over several devices by a device map (the plan of one
device does not apply; the out-of-memory back-off still does)."""
PROMPT_HINT = 128
"""Prompt tokens a scorer plans its first batch for, before it has seen a prompt; each window of
prompts is planned again for its longest prompt."""


@public(ScorerOptions)
class HFScorer:
    """Scores prompts (token id lists) against one answer set with one model."""

    def __init__(
        self,
        model: HookableModel,
        answers: AnswerSet,
        epsilon: float = 1e-4,
        batch_size: int | None = None,
        *,
        max_new_tokens: int = 0,
        settled: Any = None,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> None:
        """The options are `ScorerOptions`' (`epsilon` and `batch_size` may be positional).
        `max_new_tokens` > 0 also decodes a continuation of every prompt from the same prompt
        pass (the paper's generate mode).

        Without `batch_size`, each window of prompts gets the batch `planned_batch` gives for
        its longest prompt plus the answer trie and the generation budget (on CUDA the largest
        the memory plan says fits; 16 on a CPU); `batch_size` is the batch of the last window,
        and after an out-of-memory error no later batch exceeds the halved size."""
        self.model, self.answers, self.epsilon = model, answers, epsilon
        self.max_new_tokens = max_new_tokens  # a copy may be given another budget
        self.settled, self.temperature = settled, temperature
        self._generator = torch.Generator(device=model.device).manual_seed(seed)
        self.trie_pass = TriePass(model, answers)
        self._prefixes = PrefixCache(model)
        self.stats = ScorerStats()
        self._ceiling = batch_size  # the batch given, or the size an out-of-memory error left
        self._planned = batch_size is None
        self._overflow_said = False
        self.batch_size = batch_size or self._plan(PROMPT_HINT)

    @property
    def trie(self) -> AnswerTrie:
        """The answer set's token trie."""
        return self.trie_pass.trie

    def score(
        self, prompts: Iterable[Sequence[int]], window: int = 4096, progress: Any = None
    ) -> Iterator[ScoreResult]:
        """Results in input order. Prompts are sorted within windows so that neighbours share
        prefixes and lengths; memory stays bounded by the window, whatever the number of prompts."""
        for chunk in windows(map(token_ids, prompts), window):
            yield from self._batched(chunk, self.score_batch, progress)

    def answer_mass(self, batch: Sequence[Sequence[int]]) -> torch.Tensor:
        """The batch's unnormalised answer probabilities in one differentiable forward
        (`differentiable.answer_mass`)."""
        return differentiable.answer_mass(self.trie_pass, batch)

    def read_nodes(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The final norm and LM head on the residual stream at the trie's nodes
        (`differentiable.read_nodes`)."""
        return differentiable.read_nodes(self.trie_pass, hidden)

    def generate(self, prompts: Sequence[Sequence[int]], progress: Any = None) -> list[list[int]]:
        """The continuation `score` would decode for each prompt (the same prompt pass and
        decoding; `max_new_tokens` > 0), without the exact answer pass: for text after which
        the answer is scored (explain mode)."""
        if not self.max_new_tokens:
            raise ValueError("generate needs max_new_tokens > 0")
        ids = [token_ids(prompt) for prompt in prompts]
        return list(self._batched(ids, self._generate_batch, progress))

    def score_batch(
        self,
        batch: Sequence[Sequence[int]],
        reuse_prefix: bool = True,
        prompt_context: Callable[[], contextlib.AbstractContextManager] | None = None,
        answer_context: AnswerContext | None = None,
    ) -> list[ScoreResult]:
        """Score one batch. `prompt_context` wraps the prompt pass only (e.g. patching hooks);
        use it with `reuse_prefix=False`, so that every prompt is one left-padded row whose
        position p sits at padded column `max(len(b) for b in batch) - len(batch[row]) + p`.
        `answer_context(rows, nodes, valid)` wraps each forward of the trie pass: the answer
        positions it feeds are the trie nodes `nodes` of the batch rows `rows`
        (`probekit.engines.hf.trie_pass.TriePass.run`).

        A batch whose scores are not finite (float16 overflowed) is scored again in the
        fallback its precision tier measured (`precision.fall_back`); without one, one line says
        how many prompts overflowed."""
        device = self.model.device
        with torch.inference_mode():
            start = clock(device)
            with prompt_context() if prompt_context else contextlib.nullcontext():
                state = prompt_pass(self.model, batch, self._prefixes, self.stats, reuse_prefix)
            prompt_columns = state.mask.shape[1]
            prompt_done = clock(device)
            results, cut = self.trie_pass.run(state, self.epsilon, self.stats, answer_context)
            kv.truncate(state.cache, prompt_columns)
            # Rows the learned widths cut run again with the widths they keep; rows whose bound
            # exceeds epsilon, exactly.
            self._again(state, results, cut, self.epsilon, answer_context)
            redo = [i for i, r in enumerate(results) if r.error_bound > self.epsilon]
            self._again(state, results, redo, 0.0, answer_context)
            trie_done = clock(device)
            bad = overflowed(results)
            if bad and fall_back(self.model, bad):
                self._prefixes.clear()  # its caches are in the old tier
                return self.score_batch(batch, reuse_prefix, prompt_context, answer_context)
            if self.max_new_tokens:
                for result, tokens in zip(results, self._decode(state), strict=True):
                    result.generated = tokens
            self.stats.prompts += len(batch)
            self.stats.prompt_seconds += prompt_done - start
            self.stats.trie_seconds += trie_done - prompt_done
            self.stats.decode_seconds += clock(device) - trie_done
        if bad and not self._overflow_said and "tier" in self.model.meta.get("precision", {}):
            self._overflow_said = True
            print(
                f"probekit: the scores of {bad} prompt(s) are not finite: {self.model.dtype} "
                "overflowed (use --dtype float32 or bfloat16, or choose by --tolerance)",
                file=sys.stderr,
            )
        return results

    def _again(
        self,
        state: PromptState,
        results: list[ScoreResult],
        redo: list[int],
        epsilon: float,
        answer_context: AnswerContext | None,
    ) -> None:
        """The trie pass of the rows `redo` again at `epsilon`, each depth as wide as its rows
        keep, on a copy of their prompt cache (decoding needs every row's); their results
        replaced."""
        if not redo:
            return
        index = torch.tensor(redo, device=self.model.device)
        sub = state.rows(index)
        again, _ = self.trie_pass.run(sub, epsilon, self.stats, answer_context, index, True)
        for i, result in zip(redo, again, strict=True):
            results[i] = result

    def _generate_batch(self, batch: Sequence[Sequence[int]]) -> list[list[int]]:
        with torch.inference_mode():
            return self._decode(prompt_pass(self.model, batch, self._prefixes, self.stats))

    def _decode(self, state: PromptState) -> list[list[int]]:
        budget, settled, temperature = self.max_new_tokens, self.settled, self.temperature
        return decode(self.model, state, budget, settled, temperature, self._generator)

    def _plan(self, prompt_tokens: int) -> int:
        """The batch for prompts of `prompt_tokens` tokens: the plan's for them with every
        answer-trie node and generated token, at most the ceiling an out-of-memory error left."""
        tokens = prompt_tokens + len(self.trie.nodes) - 1 + self.max_new_tokens
        planned = planned_batch(self.model, tokens)
        return min(planned, self._ceiling) if self._ceiling else planned

    def _batched(
        self, prompts: list[Sequence[int]], run: Callable[[list], list], progress: Any
    ) -> Iterator[Any]:
        if self._planned and prompts:
            self.batch_size = self._plan(max(map(len, prompts)))
        return run_batched(prompts, run, self.batch_size, progress, self._shrink)

    def _shrink(self, batch_size: int) -> None:
        """After an out-of-memory batch: the smaller size for every later batch, and no cached
        prefixes."""
        self.batch_size = self._ceiling = batch_size
        self._prefixes.clear()


def token_ids(prompt: Any) -> Sequence[int]:
    """`prompt` if it is a non-empty sequence of token ids; else one line saying what to pass
    (text goes through `engine.encode(item).input_ids`, or `probekit.score`)."""
    if hasattr(prompt, "tolist"):  # a numpy array or a tensor of ids
        prompt = prompt.tolist()
    if (
        isinstance(prompt, str | bytes)
        or not isinstance(prompt, Sequence)
        or not prompt
        or not all(isinstance(t, Integral) and not isinstance(t, bool) for t in prompt)
    ):
        raise ProbekitError(
            f"the scorer takes token-id lists (engine.encode(item).input_ids), not a "
            f"{type(prompt).__name__}; probekit.score takes text"
        )
    return prompt


def planned_batch(model: HookableModel, tokens: int) -> int:
    """Prompts a batch of `model` holds when each prompt takes `tokens` positions (prompt, answer
    trie and generated tokens): on a CUDA device holding the whole model, the largest the memory
    plan says fits beside its weights (`probekit.engines.plan.batch_for`, counted in tokens from
    the model's shape and the device's memory); `DISPATCHED_BATCH` for a dispatched model,
    `CPU_BATCH` elsewhere."""
    if model.device.type != "cuda":
        return CPU_BATCH
    if model.dispatched:
        return DISPATCHED_BATCH
    shape = shape_of(model.hf, model.name)
    return batch_for(shape, dtype_name(model.dtype), device_memory(model.device), tokens)


def run_batched(
    prompts: list[Sequence[int]],
    run: Callable[[list[Sequence[int]]], list[Any]],
    batch_size: int,
    progress: Any = None,
    shrink: Callable[[int], None] | None = None,
) -> Iterator[Any]:
    """`run` on batches of the prompts, its outputs in input order. Lexicographic order puts
    prompts with shared prefixes together; within each block of four batches, sorting by length
    then keeps left padding small. On CUDA out-of-memory the batch size halves (`shrink(new_size)`
    is told, to keep it and free what it holds) and the same prompts are tried again; at batch
    size 1 the error is raised."""
    lexical = sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
    blocks = (lexical[k : k + 4 * batch_size] for k in range(0, len(lexical), 4 * batch_size))
    order = [i for block in blocks for i in sorted(block, key=lambda i: len(prompts[i]))]
    results: list[Any] = [None] * len(prompts)
    start = 0
    while start < len(order):
        idx = order[start : start + batch_size]
        try:
            batch_results = run([prompts[i] for i in idx])
        except torch.cuda.OutOfMemoryError:
            if batch_size == 1:
                raise
            batch_size //= 2
            if shrink is not None:
                shrink(batch_size)
            torch.cuda.empty_cache()
            continue
        for i, result in zip(idx, batch_results, strict=True):
            results[i] = result
        if progress is not None:
            progress.update(len(idx))
        start += len(idx)
    yield from results
