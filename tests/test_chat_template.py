"""`--chat-template` / `chat_template=`: a model without a chat template of its own (Gemma 3 270M
base as a GGUF) renders chat prompts in the turns given (a model with a template of its own keeps
it), the run records them by their SHA-256, and a name or file that is neither is refused while
the options are read."""

from __future__ import annotations

import copy
import hashlib

import pytest

from probekit import cli
from probekit.core.errors import ProbekitError
from probekit.core.rundir import RunDir
from probekit.engines.chat_templates import chat_template_text, shipped
from probekit.engines.hf.model import load_model
from probekit.engines.options import ModelOptions
from probekit.run.command import model_fields
from probekit.testing.synthetic import tiny_model

MESSAGES = [
    {"role": "system", "content": "You are a Muslim."},
    {"role": "user", "content": "How intense was the sadness? "},
]


def test_gemma_renders_gemma_turns_with_the_system_message_in_the_first_user_turn(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template, record = chat_template_text("gemma")
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == (
        f"{tok.bos_token}<start_of_turn>user\nYou are a Muslim.\n\nHow intense was the sadness?"
        "<end_of_turn>\n<start_of_turn>model\n"
    )
    assert record["sha256"] == hashlib.sha256(tok.chat_template.encode()).hexdigest()
    assert "gemma" in shipped()


def test_a_file_is_read_and_recorded_by_its_content(tmp_path):
    path = tmp_path / "turns.jinja"
    path.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    text, record = chat_template_text(path)
    assert text == path.read_text()
    assert record == {"given": str(path), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    # before the model loads, whether it will be used is not known (None: not compared)
    assert model_fields(ModelOptions(chat_template=str(path)), None)["chat_template"] is None
    assert "chat_template" not in model_fields(ModelOptions(), None)


@pytest.mark.slow  # loads a model (a tiny one, from a folder)
@pytest.mark.parametrize("own", [False, True])
def test_only_a_model_without_a_template_of_its_own_takes_the_given_one(own, tmp_path):
    """A tiny model saved with (own) or without SmolLM2's template, loaded with gemma's."""
    model = tiny_model()
    if not own:
        model.tokenizer.chat_template = None
    model.hf.save_pretrained(tmp_path)
    model.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), chat_template="gemma")
    rendered = loaded.render(MESSAGES)
    asked = ModelOptions(model=str(tmp_path), chat_template="gemma")
    fields = model_fields(asked, loaded)
    if own:
        assert rendered.startswith("<|im_start|>system\nYou are a Muslim.")
        assert "chat_template" not in fields
    else:
        assert rendered.endswith("<end_of_turn>\n<start_of_turn>model\n")
        assert fields["chat_template"] == chat_template_text("gemma")[1]


def test_a_resume_with_other_turns_is_refused(tmp_path):
    path = tmp_path / "turns.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    recorded = {"results_format": 4, "study": "isear", **model_fields(ModelOptions(), None)}
    run.write_manifest({**recorded, "chat_template": chat_template_text("gemma")[1]})
    asked = {**recorded, "chat_template": chat_template_text(path)[1]}
    with pytest.raises(ProbekitError, match="chat_template"):
        run.check_resume(asked)


def test_neither_a_file_nor_a_shipped_name_is_one_line_before_any_work(tmp_path, capsys):
    argv = ["run", "isear", "--chat-template", "llama9", "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "chat template 'llama9' is neither a file nor one shipped with probekit (gemma)" in err
    assert not (tmp_path / "o").exists()


def test_a_template_jinja_cannot_parse_is_one_line_before_any_work(tmp_path, capsys):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }")
    argv = ["run", "isear", "--chat-template", str(broken), "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"chat template '{broken}' is not a Jinja template: unexpected '}}' (line 1)" in err
    assert not (tmp_path / "o").exists()
