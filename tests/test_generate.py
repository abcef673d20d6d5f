"""Generate mode with the authors' 128-token budget: rows stop once their parsed answer is fixed,
and the parsed answers equal those of `transformers` greedy generation with the full budget (the
stop rule on the default model's real answers; the early stop on the tiny model)."""

from __future__ import annotations

import pytest
from conftest import answering_prompts, religion_probe

from probekit.core.answers import AnswerSet
from probekit.engines.hf.scorer import HFScorer
from probekit.studies.intergroup.parse import intensity_settled, parse_intensity
from probekit.testing.reference import generate_greedy

BUDGET = 128


@pytest.fixture(scope="module")
def probe():
    return religion_probe(6)


@pytest.fixture(scope="module")
def prompts(tiny, probe):
    """12 study prompts, alternately as they are (the default model answers them in words, so
    those rows run to end of sequence) and ending with a phrase after which it writes a number
    (those rows settle early); token ids of the default tokenizer, which the tiny model shares."""
    return answering_prompts(tiny, probe, 12)


@pytest.fixture(scope="module")
def full(smol, prompts):
    """What `generate(max_new_tokens=128)` writes for each prompt (no early stop)."""
    return [
        text
        for start in range(0, len(prompts), 8)
        for text in generate_greedy(smol, prompts[start : start + 8], max_new_tokens=BUDGET)
    ]


@pytest.mark.parametrize(
    ("text", "settled"),
    [
        ("", False),
        ("I can", False),  # may still become "I cannot"
        ("I cannot", True),
        ("85", False),  # may become 850
        ("85.", True),
        ("Emotion intensity: 85/100", True),
        ("150 and", False),  # out of range: the rule needs a second integer
        ("150 and 30 ", True),
        ("I think 7 ", True),
        ("a85 ", False),  # not an integer by the rule's word boundaries
    ],
)
def test_settled_rule(text, settled):
    assert intensity_settled(text) == settled


@pytest.mark.slow
def test_settled_never_changes_the_parse(full):
    """On real 128-token answers: wherever the rule says settled, the parse of the text so far
    is the parse of the whole answer."""
    checked = 0
    for text in full:
        for end in range(len(text) + 1):
            if intensity_settled(text[:end]):
                assert parse_intensity(text[:end]) == parse_intensity(text)
                checked += 1
                break
    assert checked > 0


def words(count: int):
    """A stop rule that holds once the text has `count` spaces: on the tiny model's random
    text, rows settle after different numbers of tokens."""
    return lambda text: text.count(" ") >= count


def test_early_stop_gives_the_full_budget_text(tiny, prompts):
    """A row stops at the first token after which its rule holds, with the text greedy
    generation writes with the whole budget; the budget costs nothing after that."""
    budget, settled = 24, words(3)
    full = generate_greedy(tiny, prompts, max_new_tokens=budget)
    scorer = HFScorer(tiny, AnswerSet.range(0, 100), 0.0, 4, max_new_tokens=budget, settled=settled)
    results = list(scorer.score(prompts))
    decode = tiny.tokenizer.decode
    for result, long in zip(results, full, strict=True):
        short = decode(result.generated, skip_special_tokens=True)
        assert long.startswith(short)  # the same greedy text, cut where the rule held
        assert settled(short) and not settled(decode(result.generated[:-1]))
    lengths = [len(r.generated) for r in results]
    assert len(set(lengths)) > 1 and max(lengths) < budget  # rows left the batch at their step
    # The decode-only path (explain mode) writes the same tokens without the exact answer pass.
    assert scorer.generate(prompts) == [r.generated for r in results]


def test_sampling_is_seeded(tiny, prompts):
    def sample(seed):
        scorer = HFScorer(
            tiny,
            AnswerSet.range(0, 100),
            batch_size=4,
            max_new_tokens=12,
            temperature=1.0,
            seed=seed,
        )
        return [r.generated for r in scorer.score(prompts[:4])]

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first
