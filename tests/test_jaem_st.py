"""JaEm-ST: the authors' layout, sampler and labels; letter tracking; exact scores; metrics;
free responses with AE (VAD) and ERA (a fake classifier, EPITOME's loader on a tiny model)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import DATA_ROOT

from probekit.cli.main import main
from probekit.core.errors import ProbekitError
from probekit.core.options import as_flags
from probekit.studies.base import Context
from probekit.studies.jaem_st import epitome, era, metrics, responses
from probekit.studies.jaem_st.data import REQUIRED, load_jaem, parse_template
from probekit.studies.jaem_st.probe import LETTERS, JaemProbe, parse_letter
from probekit.studies.jaem_st.sampler import TEMPLATE, rounded_size, sample_rows
from probekit.studies.jaem_st.study import STUDY, JaemOptions
from probekit.studies.jaem_st.vad import read_vad_lexicon

needs_data = pytest.mark.reference_data(*REQUIRED)


def run_jaem(out: Path, *options: str, root: Path | None = None) -> int:
    """`probekit run jaem-st --data DATA_ROOT OPTIONS --out OUT` (`root` in place of DATA_ROOT)."""
    return main(["run", "jaem-st", "--data", str(root or DATA_ROOT), *options, "--out", str(out)])


@pytest.fixture(scope="module")
def data():
    """The JaEm-ST files in the reference data (its tests are `needs_data`)."""
    return load_jaem(DATA_ROOT)


@pytest.fixture(scope="module")
def rows(data):
    return sample_rows(len(data.templates), data.dimensions, data.evaluated, data.dataset_size)


# ----------------------------------------------------------------- the authors' code, re-stated
# Written here from github.com/xforman/JaEm_st @ c6f3728 (dataset_generation/): what their
# load_samples, split_answers and create_cognitive_st produce, to compare against.
def authors_pieces(path: Path) -> list[str]:
    with open(path) as fh:  # text mode: universal newlines, as theirs
        raw = fh.read()
    return re.sub(r"Answers|Conversation", "Context", raw).split("Context:")


def authors_split_answers(answers: str, answer_dims: list[str]) -> list[tuple[str, str]]:
    answers = answers.replace("\n", "")
    dims = [d + ": " for d in answer_dims]
    idx = np.array([answers.index(d) for d in dims])
    for i in range(len(idx)):
        idx[np.argmax(idx)] = len(idx) - i
    texts = re.sub("|".join(dims), "\n", answers).split("\n")[1:]
    return [(dims[idx[i]].replace(": ", ""), texts[i]) for i in range(len(idx))]


def authors_ce(path, prompt, labels, values, shuffled) -> str:
    _, context, conversation, answers = authors_pieces(path)
    split = authors_split_answers(answers, labels)
    formatted = "\n".join("\n" + chr(65 + i) + ": " + split[a][1] for i, a in enumerate(shuffled))
    return (prompt + context + conversation + formatted).format(**values)


def _template_path(data, index: int) -> Path:
    return DATA_ROOT / "jaem_st" / "templates" / f"{data.templates[index].name}.txt"


# ----------------------------------------------------------------- layout and labels
@needs_data
def test_authors_layout_byte_for_byte(data, rows):
    probe = JaemProbe(data, rows, prompt=0, orders=1, seed=3)
    for sample in (0, 81):  # one row of each template (the product is template-major)
        item = next(i for i in probe.items() if i.key["sample"] == sample)
        template = data.templates[int(rows.loc[sample, TEMPLATE])]
        shown = [template.answer_index(t) for t in item.key["answer_types"].split(",")]
        values = {d.mask: rows.loc[sample, d.column] for d in data.dimensions}
        expected = authors_ce(
            _template_path(data, template.index),
            data.prompts["CE"][0],
            list(data.answer_labels),
            values,
            shown,
        )
        assert item.messages[0]["content"] == expected
        assert item.key["prompt"] == expected


@needs_data
def test_no_mask_tuple_or_header_in_any_prompt(data, rows):
    probe = JaemProbe(data, rows.iloc[::9], prompt=1, orders=1)
    assert len(probe) == 54
    for item in probe.items():
        text = item.key["prompt"]
        template = next(t for t in data.templates if t.name == item.key["template"])
        assert "{" not in text and "}" not in text
        assert template.causal_tuple not in text
        for header in ("Context:", "Conversation:", "Answers:"):
            assert header not in text


@needs_data
def test_true_labels_differ_from_authors_split_answers(data):
    labels = list(data.answer_labels)
    for index, expect_wrong in ((0, 4), (1, 2)):
        ours = data.templates[index].answers
        theirs = authors_split_answers(authors_pieces(_template_path(data, index))[3], labels)
        assert [t for _, t in ours] == [t for _, t in theirs]  # same texts, file order
        wrong = [o for o, t in zip(ours, theirs, strict=True) if o[0] != t[0]]
        assert len(wrong) == expect_wrong
        assert dict(theirs)["Empathetic"] == dict(ours)["Empathetic"]
    swapped = {
        o[0]: t[0]
        for o, t in zip(
            data.templates[1].answers,
            authors_split_answers(authors_pieces(_template_path(data, 1))[3], labels),
            strict=True,
        )
        if o[0] != t[0]
    }
    assert swapped == {"Affective": "Distressed", "Distressed": "Affective"}


@needs_data
def test_empathetic_letter_tracked_through_shuffle_and_orders(data, rows):
    probe = JaemProbe(data, rows.head(4), orders=5, seed=11)
    items = list(probe.items())
    assert len(items) == 20
    for sample in range(4):
        mine = [i for i in items if i.key["sample"] == sample]
        letters = [i.key["empathetic_letter"] for i in mine]
        assert sorted(letters) == list(LETTERS)  # each order puts it behind another letter
        template = data.templates[int(rows.loc[sample, TEMPLATE])]
        empathetic = dict(template.answers)["Empathetic"]
        for item in mine:
            text = item.key["prompt"]
            letter = item.key["empathetic_letter"]
            assert item.key["correct"] == letter
            assert f"\n{letter}: {empathetic}" in text
            assert item.key["answer_types"].split(",")[LETTERS.index(letter)] == "Empathetic"
    first = [i.key["answer_types"] for i in items if i.key["order"] == 0]
    assert len(set(first)) > 1  # the base order is drawn per sample


# ----------------------------------------------------------------- sampler
@needs_data
def test_sampler_row_counts_and_product(data):
    assert rounded_size(400, 162) == 486 and rounded_size(162, 162) == 324
    for size, total in ((400, 486), (162, 324)):
        rows = sample_rows(2, data.dimensions, data.evaluated, size, seed=0)
        assert len(rows) == total
        assert (rows[TEMPLATE].value_counts() == total // 2).all()
        cells = rows.groupby([TEMPLATE, "gender", "pronoun", "age"]).size()
        assert len(cells) == 162 and (cells == total // 162).all()
    rows = sample_rows(2, data.dimensions, data.evaluated, 400)
    per_group = rows.groupby([TEMPLATE, "gender", "pronoun"]).size()
    assert len(per_group) == 54 and (per_group == 9).all()  # 27 groups, 9 samples per template
    assert list(rows.loc[:80, TEMPLATE].unique()) == [0] and rows.loc[81, TEMPLATE] == 1


@needs_data
def test_sampler_modulo_frequencies_and_uniform(data):
    big = 162 * 400
    rows = sample_rows(2, data.dimensions, data.evaluated, big - 1, seed=5)

    for column in ("socecon", "education", "religion"):
        values = data.dimension(column).values
        freq = rows[column].value_counts(normalize=True)
        assert freq[values[0]] == pytest.approx(2 / 7, abs=0.01)
        for v in values[1:]:
            assert freq[v] == pytest.approx(1 / 7, abs=0.01)
    assert (rows["race"].value_counts(normalize=True) - 1 / 7).abs().max() < 0.01
    uniform = sample_rows(2, data.dimensions, data.evaluated, big - 1, seed=5, uniform=True)
    assert (uniform["socecon"].value_counts(normalize=True) - 1 / 6).abs().max() < 0.01
    again = sample_rows(2, data.dimensions, data.evaluated, big - 1, seed=5)
    assert again.equals(rows) and len(rows) == big


# ----------------------------------------------------------------- parse rule
@needs_data
def test_first_standalone_letter_and_settled(data, rows):
    probe = JaemProbe(data, rows.head(1))
    assert parse_letter("B") == "B" and parse_letter(" (C) because") == "C"
    assert parse_letter("Answer: D.") == "D" and parse_letter("The best is E") == "E"
    assert parse_letter("Affective") is None and parse_letter("none") is None
    assert not probe.settled("A") and not probe.settled("The")  # "A" may grow into "An"
    assert probe.settled("A.") and probe.settled("Answer: B\n")


# ----------------------------------------------------------------- exact scores
@needs_data
@pytest.mark.slow
def test_exact_letter_probabilities_equal_brute_force(data, rows, smol):
    from probekit.engines.hf.scorer import HFScorer
    from probekit.testing.reference import brute_force

    probe = JaemProbe(data, rows.iloc[[81]], orders=1)  # one real prompt: ~900 tokens
    ids = smol.encode(next(iter(probe.items()))).input_ids
    result = next(iter(HFScorer(smol, probe.answers, epsilon=0.0).score([ids])))
    reference = brute_force(smol, ids, probe.answers)
    np.testing.assert_allclose(result.probs * result.valid_mass, reference, atol=1e-5)


# ----------------------------------------------------------------- metrics
COLUMNS = [f"p::{x}" for x in LETTERS]


def _fake_scores() -> pd.DataFrame:
    types = "Empathetic,Affective,Distressed,Sympathetic,Indifferent"
    swapped = "Affective,Empathetic,Distressed,Sympathetic,Indifferent"
    rows = []
    for sample in range(6):
        for letter in "AB":
            probs = np.full(5, 0.1)
            probs[LETTERS.index(letter)] = 0.6
            rows.append(
                {
                    "sample": sample,
                    "template": "t",
                    "gender": "g" + str(sample % 2),
                    "pronoun": "she",
                    "empathetic_letter": letter,
                    "parsed": letter if sample < 3 else None,
                    "valid_mass": 1.0,
                    "greedy": letter,
                    "answer_types": types if letter == "A" else swapped,
                    **dict(zip(COLUMNS, probs, strict=True)),
                }
            )
    return pd.DataFrame(rows)


def test_metrics_scores_shares_and_outliers():
    scores = _fake_scores()
    np.testing.assert_allclose(metrics.prompt_scores(scores, "exact"), 0.6)
    assert metrics.prompt_scores(scores, "generate").tolist() == [1.0] * 6 + [0.0] * 6
    samples = metrics.sample_scores(scores, "generate", ["gender", "pronoun"])
    table = metrics.interval_table(samples, ["gender"])
    assert table["n"].tolist() == [3, 3] and table["low"].le(table["mean"]).all()
    shares = metrics.answer_type_shares(
        scores, "exact", ["Empathetic", "Affective", "Distressed", "Sympathetic", "Indifferent"]
    )
    assert shares["Empathetic"] == pytest.approx(0.6) and shares.sum() == pytest.approx(1.0)
    flagged = metrics.outliers(pd.DataFrame({"mean": [0.5] * 9 + [0.9]}), 0.54, z=2.0)
    assert flagged["outlier"].tolist() == [False] * 9 + [True]


# ----------------------------------------------------------------- VAD and ERA
def test_vad_distance_on_a_hand_made_lexicon(tmp_path):
    # A tiny lexicon written for this test, in the NRC VAD format (not NRC's values).
    path = tmp_path / "handmade_vad.txt"
    path.write_text(
        "Word\tValence\tArousal\tDominance\nhappy\t0.9\t0.6\t0.7\n"
        "sad\t0.1\t0.3\t0.2\nday\t0.5\t0.2\t0.5\n"
    )
    lexicon = read_vad_lexicon(path)
    distance = lexicon.distance("A happy day!", "So sad.")
    assert distance["vad_valence"] == pytest.approx(abs((0.9 + 0.5) / 2 - 0.1))
    assert distance["vad_arousal"] == pytest.approx(abs((0.6 + 0.2) / 2 - 0.3))
    assert distance["vad_dominance"] == pytest.approx(abs((0.7 + 0.5) / 2 - 0.2))
    assert np.isnan(lexicon.distance("happy", "nothing known")["vad_valence"])
    path.write_text("happy\t0.9\t0.6\t0.7\nsad\t0.1\tlow\t0.2\n")
    with pytest.raises(ProbekitError, match="line 2"):
        read_vad_lexicon(path)


def test_era_scores_non_empty_pairs_lower_cased():
    class Echo:
        def levels(self, pairs):
            assert all(a == a.lower() and b == b.lower() for a, b in pairs)
            return [{"IP": 2, "EX": 0, "ER": 1} for _ in pairs]

    frame = era.score_pairs(Echo(), ["Hi THERE", "x"], ["I See", " "])
    assert frame.loc[0].tolist() == [2.0, 0.0, 1.0] and frame.loc[1].isna().all()
    with pytest.raises(ProbekitError, match="package.module:factory"):
        era.load_classifier("nofactory")


# ----------------------------------------------------------------- free responses: AE and ERA
# A project-written lexicon in the NRC VAD format: common English words with arbitrary values
# (not NRC's), so that every short response holds some of its words.
HANDMADE_WORDS = (
    "i",
    "you",
    "the",
    "a",
    "and",
    "to",
    "it",
    "is",
    "that",
    "jane",
    "carl",
    "my",
    "your",
    "so",
    "of",
    "in",
    "for",
    "with",
    "what",
    "me",
    "be",
    "are",
    "do",
)


def _handmade_lexicon(path: Path) -> dict[str, tuple[float, float, float]]:
    values = {
        w: ((3 * k % 10) / 10, (7 * k % 10) / 10, (k % 5) / 5) for k, w in enumerate(HANDMADE_WORDS)
    }
    lines = ["Word\tValence\tArousal\tDominance"]
    lines += [f"{w}\t{v}\t{a}\t{d}" for w, (v, a, d) in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return values


def _mean_vad(text: str, values: dict) -> np.ndarray:
    found = [values[w] for w in re.findall(r"[a-z]+(?:'[a-z]+)?", text.lower()) if w in values]
    return np.mean(found, axis=0) if found else np.full(3, np.nan)


class WordCountClassifier:
    """A tiny project-written stand-in for EPITOME behind era.PairClassifier."""

    seen: list = []

    def levels(self, pairs):
        WordCountClassifier.seen += list(pairs)
        return [
            {"IP": min(len(r.split()), 2), "EX": int("?" in r), "ER": len(u.split()) % 3}
            for u, r in pairs
        ]


def word_count_classifier() -> WordCountClassifier:
    return WordCountClassifier()


@needs_data
@pytest.mark.slow
def test_run_with_responses_ae_era_report_and_resume(tmp_path, smol, monkeypatch, data, capsys):
    """The CE run end to end, plus free responses scored by a hand-made lexicon and a fake ERA
    classifier (8 new tokens keep it quick); then the resume of responses.parquet by the run,
    which the report only reads."""
    lexicon = _handmade_lexicon(tmp_path / "handmade_vad.txt")
    out = tmp_path / "run"
    code = run_jaem(
        out,
        *("--samples", "2", "--responses", "--response-tokens", "8"),
        *("--vad-lexicon", str(tmp_path / "handmade_vad.txt")),
        *("--era-model", "test_jaem_st:word_count_classifier"),
    )
    assert code == 0
    scores = pd.read_parquet(out / "scores.parquet")
    assert len(scores) == 2 and {"template", "sample", "gender", "prompt", "p::E"} <= set(scores)
    assert (scores["valid_mass"] > 0).all()
    for name in (
        "summary.md",
        "summary.csv",
        "groups.csv",
        "dimensions.csv",
        "accuracy_by_group.png",
        "groups_heatmap.png",
    ):
        assert (out / name).is_file(), name
    frame = pd.read_parquet(out / "responses.parquet")
    assert frame["sample"].tolist() == [0, 1] and (frame["response_tokens"] == 8).all()
    assert {"template", "gender", "pronoun", "age", "religion"} <= set(frame)
    assert frame["response"].str.strip().str.len().gt(0).all()
    template = data.templates[0]
    for row in frame.to_dict("records"):
        values = {d.mask: row[d.column] for d in data.dimensions}
        conversation = template.conversation.format(**values)
        gap = np.abs(_mean_vad(conversation, lexicon) - _mean_vad(row["response"], lexicon))
        got = [row["vad_valence"], row["vad_arousal"], row["vad_dominance"]]
        np.testing.assert_allclose(got, gap, atol=1e-12)
        jane = [line for line in conversation.splitlines() if line.startswith("Jane:")][-1]
        utterance, reply = jane[len("Jane:") :].strip().lower(), row["response"].lower()
        assert (utterance, reply) in WordCountClassifier.seen
        assert row["era_IP"] == min(len(reply.split()), 2)
        assert row["era_ER"] == len(utterance.split()) % 3
        prompt = responses.response_text(
            data, template, {d.column: row[d.column] for d in data.dimensions}
        )
        assert prompt == data.prompts["AE"][0] + template.context.format(**values) + conversation
        assert prompt.rstrip().endswith("Carl:") and "Answers:" not in prompt
    groups = pd.read_csv(out / "responses_groups.csv")
    assert set(groups["metric"]) == set(metrics.RESPONSE_METRICS)
    assert {"gender", "pronoun", "n", "low", "high", "z", "outlier"} <= set(groups)
    per_template = pd.read_csv(out / "responses_templates.csv")
    overall = per_template[(per_template["template"] == "all")].set_index("metric")["mean"]
    assert overall["vad_valence"] == pytest.approx(frame["vad_valence"].mean())
    summary = pd.read_csv(out / "summary.csv")
    assert summary.loc[0, "n_responses"] == 2
    assert summary.loc[0, "era_IP"] == pytest.approx(frame["era_IP"].mean())
    assert "AE valence" in (out / "summary.md").read_text()

    # Resume: a responses file holding only sample 0 (as a run stopped there leaves it, its
    # record kept): the report generates nothing and says so in one line, reporting the one it
    # has; the run generates sample 1 only, and the same greedy text comes back; a complete
    # file needs no model at all.
    first = frame.copy()
    path = out / "responses.parquet"
    pq.write_table(pq.read_table(path).slice(0, 1), path, write_page_checksum=True)
    calls = []
    real = responses.generate_responses
    monkeypatch.setattr(
        responses,
        "generate_responses",
        lambda m, items, *a: calls.append(len(items)) or real(m, items, *a),
    )
    manifest = json.loads((out / "manifest.json").read_text())
    scores = pd.read_parquet(out / "scores.parquet")
    capsys.readouterr()
    rows = STUDY.report(scores, out, manifest)
    said = [line for line in capsys.readouterr().out.splitlines() if "responses" in line]
    assert calls == [] and said == [
        "responses: 1 of 2 samples have none yet; run the same command again to generate them"
    ]
    assert rows[0]["n_responses"] == 1
    STUDY.after_run(None, smol, scores, out, manifest)
    assert calls == [1]
    again = pd.read_parquet(out / "responses.parquet")
    assert again["response"].tolist() == first["response"].tolist()
    STUDY.after_run(None, smol, scores, out, manifest)
    assert calls == [1]
    # Responses of another budget are not this run's: set aside and generated again.
    other = {**manifest, "responses": {**manifest["responses"], "max_new_tokens": 4}}
    STUDY.after_run(None, smol, scores, out, other)
    assert calls == [1, 2] and (out / "responses.parquet.mismatched").is_file()
    assert (pd.read_parquet(path)["response_tokens"] == 4).all()


@needs_data
def test_responses_skip_lines_and_bad_lexicon(tmp_path, capsys):
    bad = tmp_path / "bad_vad.txt"
    bad.write_text("Word\tValence\tArousal\tDominance\nhappy\t0.9\t0.6\t0.7\nsad\t0.1\n")
    out = tmp_path / "out"
    code = run_jaem(out, "--samples", "1", "--responses", "--vad-lexicon", str(bad))
    err = capsys.readouterr().err.strip()
    assert code == 2 and "line 3" in err and len(err.splitlines()) == 1 and not out.exists()
    code = run_jaem(out, "--vad-lexicon", str(bad))
    assert code == 2 and "add --responses" in capsys.readouterr().err
    code = run_jaem(out, "--responses", "--era-model", str(tmp_path))
    assert code == 2 and "finetuned_IP.pth" in capsys.readouterr().err and not out.exists()
    frame = pd.DataFrame({"response": ["Fine.", ""]})
    scored = responses.score_responses(frame, ["Jane: hi", "Jane: hi"], None, None)
    assert list(scored) == ["response"]  # nothing enabled, nothing added
    assert "vad_lexicon=PATH" in responses.ae_skip_message()
    assert "era_model=FOLDER" in era.skip_message()
    assert "--vad-lexicon PATH" in as_flags(responses.ae_skip_message())
    assert "--era-model FOLDER" in as_flags(era.skip_message())


@pytest.mark.slow
def test_epitome_folder_loads_strictly_and_scores(tmp_path, smol):
    from transformers import RobertaConfig

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    tiny = {"hidden_size": 32, "intermediate_size": 48, "max_position_embeddings": 80}
    layers = {"num_hidden_layers": 1, "num_attention_heads": 1, "type_vocab_size": 1}
    config = RobertaConfig(vocab_size=len(smol.tokenizer), pad_token_id=1, **tiny, **layers)
    built = {}
    for dim, name in epitome.FILES.items():
        model = epitome.EpitomeBiEncoder(config).eval()
        torch.save(model.state_dict(), tmp_path / name)
        built[dim] = model
    smol.tokenizer.save_pretrained(tmp_path)  # a stand-in tokenizer (roberta-base is not here)
    era.check_spec(str(tmp_path))
    classifier = era.load_classifier(str(tmp_path), "cpu")
    pairs = [("i lost my job today.", "i am sorry. what happened?"), ("hello", "word " * 200)]
    levels = classifier.levels(pairs)
    assert classifier._encode(pairs[1][1])["input_ids"].shape[1] == epitome.MAX_TOKENS
    with torch.inference_mode():
        for (seeker, response), got in zip(pairs, levels, strict=True):
            sides = [classifier._encode(seeker), classifier._encode(response)]
            expect = {d: int(m(*sides).argmax(-1)) for d, m in built.items()}
            assert got == expect
    state = built["IP"].state_dict()
    state["extra.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / epitome.FILES["IP"])
    with pytest.raises(ProbekitError, match="does not match EPITOME"):
        era.load_classifier(str(tmp_path), "cpu")


# ----------------------------------------------------------------- mechanism
@needs_data
def test_patch_pairs_and_spans_from_mask_locations(data):
    options = JaemOptions(data=DATA_ROOT, samples=2, dimension="pronoun")
    probe, items = STUDY.mechanism_items(options, Context("patch", seed=0))
    assert len(items) == 6 and {i.unit for i in items} == {"0", "1"}
    count = data.templates[0].context.count("{PRONOUN}")
    for item in items:
        assert list(item.spans) == ["pronoun"]
        assert len(item.spans["pronoun"]) == count  # every {PRONOUN}, never "he" in "the"
        assert set(item.span_text("pronoun").split()) == {item.key["pronoun"]}
    from probekit.core.items import EncodedItem

    encoded = [EncodedItem(i, "", [], [], {}) for i in items]
    pairs = STUDY.pairs(probe, encoded)
    assert len(pairs) == 4
    for clean, corrupt in pairs:
        assert clean.item.key["pronoun"] == "she" and corrupt.item.key["pronoun"] != "she"
        assert clean.item.unit == corrupt.item.unit
        same = {k: v for k, v in clean.item.key.items() if k not in ("pronoun", "prompt")}
        assert same == {k: v for k, v in corrupt.item.key.items() if k not in ("pronoun", "prompt")}


# ----------------------------------------------------------------- bad input
def _copy_root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(DATA_ROOT / "jaem_st", root / "jaem_st")
    for path in (root / "jaem_st").rglob("*"):
        path.chmod(0o644 if path.is_file() else 0o755)
    return root


@needs_data
def test_bad_templates_and_dimensions_are_one_line_errors(tmp_path, capsys):
    labels = ("Empathetic", "Sympathetic", "Affective", "Indifferent", "Distressed")
    with pytest.raises(ProbekitError, match="no 'Answers:'"):
        parse_template("(t)\nContext: a\nConversation: b\n", 0, "t", labels)
    with pytest.raises(ProbekitError, match="'Cheerful' is not one of"):
        parse_template("(t)\nContext:a\nConversation:b\nAnswers:\nCheerful: x\n", 0, "t", labels)
    root = _copy_root(tmp_path)
    template = root / "jaem_st" / "templates" / "sample1_worker_exploitation.txt"
    template.write_text(template.read_text().replace("{AGE}", "{HEIGHT}"))
    out = tmp_path / "out"
    code = run_jaem(out, root=root)
    err = capsys.readouterr().err.strip().splitlines()
    assert "is not the pinned JaEm-ST file" in err[0]  # the changed template, said apart
    assert code == 2 and "{HEIGHT} has no values" in err[1] and len(err) == 2
    assert not out.exists()
    root = _copy_root(tmp_path / "b")
    dims = root / "jaem_st" / "dimensions.json"
    dims.write_text(dims.read_text().replace('"age": ["30", "40", "50"]', '"age": []'))
    with pytest.raises(ProbekitError, match=r"\{AGE\}: dimensions.json has no values"):
        load_jaem(root)
