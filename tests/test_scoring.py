"""The exact scoring engine against brute force, across batch sizes, and against generation."""

from __future__ import annotations

import os

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
def prompts(smol):
    """Study prompts of different lengths plus two short raw-text prompts."""
    out = [
        chat_ids(smol, p, e, ev)
        for p in ("a Christian", "a Muslim")
        for e in ("a Jew", "a Hindu")
        for ev in EVENTS
    ]
    out += [smol.tokenizer.encode(t) for t in ("Q: How old is the oldest cat?\nA:", "Score: ")]
    return out


def unnormalised(result):
    return result.probs * result.valid_mass


@pytest.mark.parametrize(
    ("spec", "which"),
    [("0-10", [0, 7]), ("0-100", [12]), (ISEAR, [0, 12])],
    ids=["0-10", "0-100", "isear-words"],
)
@pytest.mark.slow
def test_exact_against_brute_force(smol, prompts, spec, which):
    """Exact scoring (epsilon 0) against the float64 brute force, with tolerance 1e-5 (fp32
    logits differ by about that between two computation paths), all relative to the reference
    valid mass `ref.sum()`: the valid mass itself (`|ours - ref.sum()| <= 1e-5 * ref.sum()`), every
    unnormalised answer probability (`|ours[a] - ref[a]| <= 1e-5 * ref.sum()` for each answer `a`,
    where ours = `probs * valid_mass`), and the normalised probabilities (`ref / ref.sum()`)."""
    answers = AnswerSet.parse(spec)
    results = HFScorer(smol, answers, epsilon=0.0, batch_size=4).score_batch(
        [prompts[i] for i in which]
    )
    for i, result in zip(which, results, strict=True):
        reference = brute_force(smol, prompts[i], answers)
        assert np.abs(unnormalised(result) - reference).max() <= 1e-5
        assert result.valid_mass == pytest.approx(reference.sum(), abs=1e-5)
        assert result.error_bound == 0.0
        mass = reference.sum()
        assert abs(result.valid_mass - mass) <= 1e-5 * mass
        assert np.abs(unnormalised(result) - reference).max() <= 1e-5 * mass
        assert np.abs(result.probs - reference / mass).max() <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["0-100", ISEAR], ids=["0-100", "isear-words"])
def test_shared_prefix_peer_equals_brute_force(smol, prompts, spec):
    """The benchmark's peer (e): one prompt pass, its cache shared by batched candidates, gives
    the brute force's numbers (candidates split across several batches here)."""
    answers = AnswerSet.parse(spec)
    reference = brute_force(smol, prompts[3], answers)
    peer = shared_prefix(smol, prompts[3], answers, batch_size=48)
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


@pytest.mark.slow
def test_multi_token_words_are_in_the_trie(smol):
    answers = AnswerSet.parse(ISEAR)
    scorer = HFScorer(smol, answers, epsilon=0.0)
    assert scorer.trie.max_depth >= 2  # "disappointment" = dis/app/ointment without a space


@pytest.mark.slow
def test_batch_invariance(smol, prompts):
    answers = AnswerSet.range(0, 100)
    one = [r for p in prompts for r in HFScorer(smol, answers, 0.0, 1).score_batch([p])]
    many = list(HFScorer(smol, answers, 0.0, 16).score(prompts))
    for a, b in zip(one, many, strict=True):
        assert np.abs(a.probs - b.probs).max() <= 1e-5
        assert a.valid_mass == pytest.approx(b.valid_mass, abs=1e-6)


@pytest.mark.slow
def test_probabilities_sum_to_one_and_summaries(smol, prompts):
    answers = AnswerSet.range(0, 100)
    for result in HFScorer(smol, answers).score(prompts[:4]):
        assert result.probs.sum() == pytest.approx(1.0, abs=1e-9)
        assert result.expected == pytest.approx(float(result.probs @ answers.values))
        assert result.most_probable == answers.answers[int(np.argmax(result.probs))]
        assert 0 < result.valid_mass <= 1


@pytest.mark.slow
def test_argmax_matches_greedy_generation(smol, prompts):
    answers = AnswerSet.range(0, 100)
    results = list(HFScorer(smol, answers, epsilon=0.0).score(prompts))
    responses = generate_greedy(smol, prompts, max_new_tokens=5)
    checked = 0
    for result, response in zip(results, responses, strict=True):
        head = response.lstrip(" ")
        digits = head[: len(head) - len(head.lstrip("0123456789"))]
        if digits and int(digits) <= 100 and not (len(digits) > 1 and digits[0] == "0"):
            assert result.argmax == digits
            checked += 1
    assert checked >= 1, "no prompt started its greedy answer with a number"


@pytest.mark.slow
def test_pruning_bound_holds(smol, prompts):
    answers = AnswerSet.range(0, 100)
    exact = list(HFScorer(smol, answers, epsilon=0.0).score(prompts))
    for epsilon in (1e-3, 1e-2):
        pruned = list(HFScorer(smol, answers, epsilon=epsilon).score(prompts))
        assert any(p.error_bound > 0 for p in pruned)
        for e, p in zip(exact, pruned, strict=True):
            true_error = np.abs(unnormalised(e) - unnormalised(p)).sum() / e.valid_mass
            assert true_error <= p.error_bound + 1e-5  # float noise of batch composition
            assert p.error_bound <= epsilon


@pytest.mark.slow
def test_prefix_reuse_is_transparent(smol, prompts):
    answers = AnswerSet.range(0, 10)
    scorer = HFScorer(smol, answers, epsilon=0.0, batch_size=8)
    shared = scorer.score_batch(prompts[:6])
    plain = scorer.score_batch(prompts[:6], reuse_prefix=False)
    for a, b in zip(shared, plain, strict=True):
        assert np.abs(a.probs - b.probs).max() <= 1e-5


@pytest.mark.slow
def test_stats_count_the_work(smol, prompts):
    """At epsilon 0 every trie node is fed once per prompt; a shared prefix is computed once."""
    scorer = HFScorer(smol, AnswerSet.range(0, 10), epsilon=0.0, batch_size=8)
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


@pytest.mark.slow
def test_decode_from_the_scoring_cache_matches_generate(smol, prompts):
    scorer = HFScorer(smol, AnswerSet.range(0, 100), batch_size=4, max_new_tokens=6)
    results = list(scorer.score(prompts))
    ours = smol.tokenizer.batch_decode([r.generated for r in results], skip_special_tokens=True)
    assert ours == generate_greedy(smol, prompts, max_new_tokens=6)
    plain = list(HFScorer(smol, AnswerSet.range(0, 100), batch_size=4).score(prompts))
    for a, b in zip(results, plain, strict=True):  # decoding leaves the scores untouched
        assert np.abs(a.probs - b.probs).max() <= 1e-6
