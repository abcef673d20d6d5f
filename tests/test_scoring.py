"""The exact scoring engine against brute force, across batch sizes, and against generation: on
the tiny random-weight model (the mechanics), and on the default model where the numbers depend
on its trained weights."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.engines.hf.scorer import HFScorer
from probekit.studies.intergroup import get_setting, render_messages
from probekit.studies.intergroup.parse import parse_intensity
from probekit.testing.reference import brute_force, generate_greedy, shared_prefix

ISEAR = (
    "anger,disgust,fear,guilt,joy,sadness,shame,anxiety,disappointment,embarrassment,"
    "frustration,regret"
)
EVENTS = [
    "My dog ran away and we never found him.",
    "I was told in front of everyone that my project was the worst one in the class.",
    "I passed my driving test.",
]


def chat_ids(model, perceiver, experiencer, event, emotion="sadness"):
    messages = render_messages(get_setting("P0S0T0"), perceiver, experiencer, emotion, event)
    return model.tokenizer.encode(model.render(messages), add_special_tokens=False)


@pytest.fixture(scope="module")
def prompts(tiny):
    """Study prompts of different lengths plus two short raw-text prompts (token ids of the
    default model's tokenizer, which the tiny model shares)."""
    out = [
        chat_ids(tiny, p, e, ev)
        for p in ("a Christian", "a Muslim")
        for e in ("a Jew", "a Hindu")
        for ev in EVENTS
    ]
    out += [tiny.tokenizer.encode(t) for t in ("Q: How old is the oldest cat?\nA:", "Score: ")]
    return out


def unnormalised(result):
    return result.probs * result.valid_mass


@pytest.mark.parametrize(
    ("spec", "which"),
    [("0-10", [0, 7]), ("0-100", [12]), (ISEAR, [0, 12])],
    ids=["0-10", "0-100", "isear-words"],
)
def test_exact_against_brute_force(tiny, prompts, spec, which):
    """Exact scoring (epsilon 0) against the float64 brute force, with tolerance 1e-5 (fp32
    logits differ by about that between two computation paths), all relative to the reference
    valid mass `ref.sum()`: the valid mass itself (`|ours - ref.sum()| <= 1e-5 * ref.sum()`), every
    unnormalised answer probability (`|ours[a] - ref[a]| <= 1e-5 * ref.sum()` for each answer `a`,
    where ours = `probs * valid_mass`), and the normalised probabilities (`ref / ref.sum()`)."""
    answers = AnswerSet.parse(spec)
    results = HFScorer(tiny, answers, epsilon=0.0, batch_size=4).score_batch(
        [prompts[i] for i in which]
    )
    for i, result in zip(which, results, strict=True):
        reference = brute_force(tiny, prompts[i], answers)
        assert np.abs(unnormalised(result) - reference).max() <= 1e-5
        assert result.valid_mass == pytest.approx(reference.sum(), abs=1e-5)
        assert result.error_bound == 0.0
        mass = reference.sum()
        assert abs(result.valid_mass - mass) <= 1e-5 * mass
        assert np.abs(unnormalised(result) - reference).max() <= 1e-5 * mass
        assert np.abs(result.probs - reference / mass).max() <= 1e-5


@pytest.mark.parametrize("spec", ["0-100", ISEAR], ids=["0-100", "isear-words"])
def test_shared_prefix_peer_equals_brute_force(tiny, prompts, spec):
    """The benchmark's peer (e): one prompt pass, its cache shared by batched candidates, gives
    the brute force's numbers (candidates split across several batches here)."""
    answers = AnswerSet.parse(spec)
    reference = brute_force(tiny, prompts[3], answers)
    peer = shared_prefix(tiny, prompts[3], answers, batch_size=48)
    assert np.abs(peer - reference).max() <= 1e-5 * reference.sum()


@pytest.mark.slow
def test_independent_of_thread_count(smol, prompts):
    """The sums over the vocabulary must not depend on the BLAS kernel's blocking: the same
    prompt scored with 1 and with 2 torch threads gives the same valid mass (to 1e-7 relative)."""
    answers = AnswerSet.range(0, 100)
    before = torch.get_num_threads()
    masses = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            scorer = HFScorer(smol, answers, epsilon=0.0, batch_size=2)
            batch = [prompts[0], prompts[12]]  # a chat prompt (shared-prefix path) and a raw one
            masses[threads] = [r.valid_mass for r in scorer.score_batch(batch)]
    finally:
        torch.set_num_threads(before)
    for one, two in zip(masses[1], masses[2], strict=True):
        assert one == pytest.approx(two, rel=1e-7)


def test_multi_token_words_are_in_the_trie(tiny):
    answers = AnswerSet.parse(ISEAR)
    scorer = HFScorer(tiny, answers, epsilon=0.0)
    assert scorer.trie.max_depth >= 2  # "disappointment" = dis/app/ointment without a space


def test_batch_invariance(tiny, prompts):
    answers = AnswerSet.range(0, 100)
    single = HFScorer(tiny, answers, 0.0, 1)
    one = [r for p in prompts for r in single.score_batch([p])]
    many = list(HFScorer(tiny, answers, 0.0, 16).score(prompts))
    for a, b in zip(one, many, strict=True):
        assert np.abs(a.probs - b.probs).max() <= 1e-5
        assert a.valid_mass == pytest.approx(b.valid_mass, rel=1e-5)


def test_probabilities_sum_to_one_and_summaries(tiny, prompts):
    answers = AnswerSet.range(0, 100)
    for result in HFScorer(tiny, answers).score(prompts[:4]):
        assert result.probs.sum() == pytest.approx(1.0, abs=1e-9)
        assert result.expected == pytest.approx(float(result.probs @ answers.values))
        assert result.most_probable == answers.answers[int(np.argmax(result.probs))]
        assert 0 < result.valid_mass <= 1


def test_the_greedy_column_is_greedy_generation(tiny, prompts):
    """The `greedy` column is the answer greedy decoding writes. The tiny model's greedy text
    starts with a random word, so the answers are those first words (a word ends where the next
    token starts with neither a letter nor a digit); the most probable answer often differs."""
    responses = generate_greedy(tiny, prompts, max_new_tokens=5)
    words = [re.match(r" ?([^\W_]*)", response).group(1) for response in responses]
    answers = AnswerSet.parse(",".join(sorted(set(filter(None, words)))))
    results = HFScorer(tiny, answers, epsilon=0.0).score_batch(prompts)
    checked = 0
    for result, word in zip(results, words, strict=True):
        if word:
            assert result.greedy == word
            checked += 1
    assert checked >= len(prompts) // 2, "too few greedy answers start with a word"
    assert any(r.greedy != r.most_probable for r in results)


def test_pruning_bound_holds(tiny, prompts):
    answers = AnswerSet.range(0, 100)
    exact = list(HFScorer(tiny, answers, epsilon=0.0).score(prompts))
    for epsilon in (1e-3, 1e-2):
        pruned = list(HFScorer(tiny, answers, epsilon=epsilon).score(prompts))
        assert any(p.error_bound > 0 for p in pruned)
        for e, p in zip(exact, pruned, strict=True):
            true_error = np.abs(unnormalised(e) - unnormalised(p)).sum() / e.valid_mass
            assert true_error <= p.error_bound + 1e-5  # float noise of batch composition
            assert p.error_bound <= epsilon


def test_prefix_reuse_is_transparent(tiny, prompts):
    answers = AnswerSet.range(0, 10)
    scorer = HFScorer(tiny, answers, epsilon=0.0, batch_size=8)
    shared = scorer.score_batch(prompts[:6])
    plain = scorer.score_batch(prompts[:6], reuse_prefix=False)
    for a, b in zip(shared, plain, strict=True):
        assert np.abs(a.probs - b.probs).max() <= 1e-5


def test_stats_count_the_work(tiny, prompts):
    """At epsilon 0 every trie node is fed once per prompt; a shared prefix is computed once."""
    scorer = HFScorer(tiny, AnswerSet.range(0, 10), epsilon=0.0, batch_size=8)
    batch = prompts[:6]
    scorer.score_batch(batch)
    shared = len(os.path.commonprefix(batch))
    assert shared >= 8
    stats = scorer.stats
    assert stats.prompts == 6
    assert stats.trie_positions == 6 * (len(scorer.trie.nodes) - 1)
    assert stats.prompt_tokens == shared + sum(len(p) - shared for p in batch)
    assert stats.prompt_seconds > 0 and stats.trie_seconds > 0 and stats.decode_seconds >= 0
    assert 0 < stats.head_seconds < stats.trie_seconds


@pytest.mark.parametrize(
    ("response", "value"),
    [
        ("85", 85),
        (" 70 out of 100", 70),
        ("I cannot rate this.", -1),
        ("I can't", -1),
        ("I'm not rating that", -1),
        ("The person felt sad.", -1),
        ("150, I mean 90", 90),
        ("150", -1),
        ("3 or 4", 3),
        ("It is 40.", 40),
    ],
)
def test_paper_parse_rule(response, value):
    assert parse_intensity(response) == value


@pytest.mark.parametrize(
    ("spec", "message"),
    [("", "empty item"), ("A,A", "duplicate"), ("5-1", "lo > hi"), ("A,,B", "empty item")],
)
def test_bad_answer_specs(spec, message):
    with pytest.raises(ProbekitError, match=message):
        AnswerSet.parse(spec)


def test_decode_from_the_scoring_cache_matches_generate(tiny, prompts):
    scorer = HFScorer(tiny, AnswerSet.range(0, 100), batch_size=4, max_new_tokens=6)
    results = list(scorer.score(prompts))
    ours = tiny.tokenizer.batch_decode([r.generated for r in results], skip_special_tokens=True)
    assert ours == generate_greedy(tiny, prompts, max_new_tokens=6)
    plain = list(HFScorer(tiny, AnswerSet.range(0, 100), batch_size=4).score(prompts))
    for a, b in zip(results, plain, strict=True):  # decoding leaves the scores untouched
        assert np.abs(a.probs - b.probs).max() <= 1e-6
