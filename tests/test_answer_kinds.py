"""Answer kinds: a set's kind is the first that accepts all its answers; the kind owns the stop
rule and the values; a new kind is one `AnswerKind`."""

import numpy as np
import pytest
import torch

from probekit.core.answers import ANSWER_KINDS, INTEGER, WORD, AnswerKind, AnswerSet
from probekit.core.errors import ProbekitError


def test_a_set_takes_the_first_kind_that_accepts_all_its_answers():
    assert AnswerSet.parse("0-100").kind is INTEGER and AnswerSet.parse("0-100").numeric
    assert AnswerSet.parse("A-E").kind is WORD and not AnswerSet.parse("A-E").numeric
    assert AnswerSet.parse("1,2,x").kind is WORD  # one answer that is not a number
    assert ANSWER_KINDS == (INTEGER, WORD)


def test_the_kind_owns_the_stop_rule_and_the_values():
    assert INTEGER.extends("7") and not INTEGER.extends(" 7") and not INTEGER.extends("a")
    assert WORD.extends("a") and WORD.extends("7") and not WORD.extends(" a")
    assert not WORD.extends(".") and not INTEGER.extends("")
    assert np.array_equal(AnswerSet.parse("-2-2").values, [-2.0, -1.0, 0.0, 1.0, 2.0])
    with pytest.raises(ProbekitError, match="the answers of a word set have no values"):
        _ = AnswerSet.parse("yes,no").values


def test_a_new_kind_is_one_instance():
    decimal = AnswerKind(
        "decimal",
        accepts=lambda a: a.replace(".", "", 1).isdigit(),
        extends=lambda text: text[:1].isdigit() or text[:1] == ".",
        value=float,
    )
    assert decimal.numeric and decimal.extends(".5") and not decimal.extends(" 5")
    assert [decimal.value(a) for a in ("0.5", "2.25")] == [0.5, 2.25]


def test_the_extension_masks_are_each_tokens_stop_rule_read_once_per_vocabulary(tokenizer):
    """Row k marks the tokens that extend a `ANSWER_KINDS[k]` answer, token by token as the kind
    says; padded head rows extend nothing; a call gets its own copy of the one reading, another
    tokenizer object of the same vocabulary shares it, and a tokenizer that grew is read
    again."""
    import copy

    from probekit.engines.trie import _byte_level, _pieces, _texts, extension_masks

    tok = copy.deepcopy(tokenizer)
    texts = _texts(_pieces(tok), _byte_level(tok))  # each entry's surface text
    masks = extension_masks(tok, len(tok) + 3)
    assert masks.shape == (len(ANSWER_KINDS), len(tok) + 3) and not masks[:, len(tok) :].any()
    for k, kind in enumerate(ANSWER_KINDS):
        assert masks[k, : len(tok)].tolist() == [kind.extends(text) for text in texts]
    masks.fill_(True)  # the caller's copy
    assert not extension_masks(tok, len(tok) + 3)[:, len(tok) :].any()
    twin = copy.deepcopy(tok)
    assert torch.equal(extension_masks(twin, len(tok)), extension_masks(tok, len(tok)))
    tok.add_tokens(["7zz"])
    grown = extension_masks(tok, len(tok))
    assert grown.shape[1] == len(tok) and grown[:, -1].tolist() == [True, True]
