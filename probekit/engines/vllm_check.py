"""Number answers scored exactly through vLLM's log-probabilities: a cross-check of the exact
scorer on another engine.

vLLM returns the log-probabilities of at most 128 given token ids per generated position
(`SamplingParams.logprob_token_ids`), and nothing from inside a prompt: so each node of the
answer trie is one request, the prompt followed by the node's tokens, asking for the log-probs
of the node's children and of the tokens that would extend a number (SmolLM2's digit class: 14
tokens). P(answer) is then the product along its path times the stop probability at its last
node (1 minus the extending tokens' mass), summed over its surface forms: the definition of the
transformers engine's trie pass, with no pruning. Letter and word answers cannot be checked this
way (the class of tokens that extend a word holds tens of thousands of ids).

Cost: one request per trie node per prompt, each re-reading its prompt (vLLM's CPU prefix cache
reuses whole 128-token blocks only): 24 nodes for 0-10, 204 for 0-100 with SmolLM2's tokenizer.
It is a check of the engine, not a way to run a study; `benchmarks/engines.py --vllm-check N`
measures it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from probekit.core.answers import ANSWER_KINDS, AnswerSet
from probekit.core.errors import ProbekitError
from probekit.engines.trie import AnswerTrie, extension_masks

if TYPE_CHECKING:
    from probekit.engines.vllm import VllmEngine

MAX_IDS = 128  # vLLM's bound on `logprob_token_ids` per request


def vllm_answer_mass(
    engine: VllmEngine, answers: AnswerSet, prompts: Sequence[Sequence[int]]
) -> np.ndarray:
    """Unnormalised P(answer) [prompts, answers] of number answers, read from vLLM's
    log-probabilities of every trie node (one request per node and prompt, all in one call)."""
    if not answers.numeric:
        raise ProbekitError(
            "vLLM's cross-check scores number answers only (a word's extending tokens are more "
            f"than the {MAX_IDS} ids vLLM returns log-probabilities for)"
        )
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

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
    requests, params = [], []
    for prompt in prompts:
        for path, ids in zip(paths, asked, strict=True):
            requests.append(TokensPrompt(prompt_token_ids=[*prompt, *path]))
            params.append(
                SamplingParams(
                    temperature=0.0, max_tokens=1, logprob_token_ids=ids, detokenize=False
                )
            )
    outputs = engine.llm().generate(requests, params, use_tqdm=False)
    n = len(trie.nodes)
    mass = np.zeros((len(prompts), len(answers)))
    for row in range(len(prompts)):
        node_logp = np.zeros(n)
        for i, node in enumerate(trie.nodes):
            logprobs = outputs[row * n + i].outputs[0].logprobs[0]
            for token, child in node.children.items():
                node_logp[child] = node_logp[i] + logprobs[token].logprob
            if node.terminal_for:
                stop = 1.0 - sum(np.exp(logprobs[t].logprob) for t in extend)
                for answer in node.terminal_for:
                    mass[row, answer] += np.exp(node_logp[i]) * stop
    return mass


def cross_check(
    engine: VllmEngine, answers: AnswerSet, prompts: Sequence[Sequence[int]]
) -> pd.DataFrame:
    """The transformers engine's exact scores (epsilon 0) against vLLM's, per prompt: both valid
    masses, the largest |difference| of the normalised probabilities and of the expected value;
    `attrs` holds each engine's seconds and vLLM's request count."""
    start = time.perf_counter()
    exact = list(engine.exact.scorer(answers, epsilon=0.0).score(prompts))
    hf_seconds = time.perf_counter() - start
    start = time.perf_counter()
    mass = vllm_answer_mass(engine, answers, prompts)
    vllm_seconds = time.perf_counter() - start
    valid = mass.sum(axis=1)
    probs = mass / valid[:, None]
    pairs = list(zip(exact, probs, strict=True))
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
        vllm_seconds=vllm_seconds,
        vllm_requests=len(prompts) * len(AnswerTrie.build(answers, engine.tokenizer).nodes),
    )
    return table
