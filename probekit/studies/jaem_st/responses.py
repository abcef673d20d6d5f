"""Carl's free response (`--responses`) and its AE and ERA scores, one row per sample.

The prompt is `prompts.json` AE[0] (empty in the authors' data: no instruction) followed by the
context and the conversation, which ends with `Carl:`; it is filled like the CE prompt and sent
as the single user message (the model's chat template). The paper gives no decoding settings:
probekit decodes greedily (`Scorer` with a generation budget) up to `RESPONSE_TOKENS` new tokens,
stopping at end of sequence.

AE is the per-dimension VAD distance (`vad.py`) between the filled conversation and the response;
ERA scores the pair (Jane's last utterance, the response) with a pair classifier (`era.py`).
`responses.parquet` holds the sample's key columns, `prompt_id` (the response prompt's id),
`response`, `response_tokens` (the budget), `vad_*` and `era_*`. The run writes it with its
loaded model (`write_responses`, the study's `after_run`); the report only reads it
(`read_responses`), and says in one line what it lacks. It is finished work
(`probekit.core.store`): checksummed, stamped with the run's settings and the budget, written
every `CHUNK` samples, so a run stopped while generating resumes from the responses it holds; a
damaged file, or one generated under other settings or for other samples, is set aside by the
run (one line) and its responses generated again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

import probekit.studies.jaem_st.era as era
import probekit.studies.jaem_st.vad as vad
from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import PROMPT_ID, Item, fill_template
from probekit.core.options import given, named
from probekit.core.progress import echo
from probekit.core.rundir import RowKey
from probekit.core.store import Unusable, read_rows, take_rows, write_rows
from probekit.engines.base import Engine
from probekit.studies.jaem_st.data import JaemData, Template, load_jaem
from probekit.studies.jaem_st.probe import LETTERS

RESPONSE_TOKENS = 64
RESPONSES_FILE = "responses.parquet"
CHUNK = 32
SPEAKER = "Jane:"


def ae_skip_message() -> str:
    """The line saying that AE is skipped, naming the option in the caller's words."""
    return (
        f"AE skipped: no VAD lexicon given; pass {given('vad_lexicon', 'PATH', placeholder=True)} "
        "(a word<TAB>valence<TAB>arousal<TAB>dominance file such as the NRC VAD lexicon, which "
        "probekit does not ship)"
    )


def response_text(
    data: JaemData, template: Template, values: dict[str, str], conversation: bool = False
) -> str:
    """AE[0] + context + conversation, filled with the sample's values by mask (`conversation`:
    the filled conversation alone, the AE source text)."""
    instruction = (data.prompts.get("AE") or [""])[0]
    text = "" if conversation else instruction + template.context
    by_mask = {d.mask: str(values[d.column]) for d in data.dimensions}
    return fill_template(text + template.conversation, **by_mask)[0]


def speaker_utterance(conversation: str) -> str:
    """Jane's last line without its speaker name: the 'seeker post' of the ERA pair."""
    lines = [line for line in conversation.splitlines() if line.startswith(SPEAKER)]
    return lines[-1][len(SPEAKER) :].strip() if lines else conversation.strip()


def sample_table(scores: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """One row per sample (its first prompt): `sample`, `template` and the dimension columns."""
    keys = ["sample", "template", *columns]
    return scores.drop_duplicates("sample")[keys].sort_values("sample").reset_index(drop=True)


def response_id(sample: dict[str, Any]) -> str:
    """The id of a sample's response prompt (`prompt_id` in `responses.parquet`)."""
    return f"{sample['template']}|{sample['sample']}|response"


def response_items(data: JaemData, samples: pd.DataFrame) -> list[Item]:
    """The response prompt of every sample, as one user message."""
    by_name = {t.name: t for t in data.templates}
    items = []
    for row in samples.to_dict("records"):
        message = {"role": "user", "content": response_text(data, by_name[row["template"]], row)}
        items.append(Item(response_id(row), key=row, unit=str(row["sample"]), messages=(message,)))
    return items


def response_key(manifest: dict[str, Any], ids: Sequence[str]) -> RowKey:
    """The settings and prompts the rows of `responses.parquet` are kept under: the run's, and
    the generation budget."""
    budget = manifest["responses"]["max_new_tokens"]
    return RowKey.of({**manifest, "response_tokens": budget}, ids, "generated")


def generate_responses(
    model: Engine,
    items: Sequence[Item],
    max_new_tokens: int,
    save: Callable[[list[str]], None],
) -> list[str]:
    """Greedy continuations (end of sequence or the budget), decoded without special tokens;
    `save(responses so far)` after every `CHUNK` items."""
    # The Scorer reads an answer distribution too (here over A-E, unused): only its greedy
    # continuation, decoded from the same prompt pass, is kept.
    scorer = model.scorer(AnswerSet(LETTERS), max_new_tokens=max_new_tokens)
    responses: list[str] = []
    for start in range(0, len(items), CHUNK):
        ids = [model.encode(item).input_ids for item in items[start : start + CHUNK]]
        generated = [r.generated for r in scorer.score(ids, window=len(ids))]
        responses += model.decode(generated)
        save(responses)
    return responses


def score_responses(
    frame: pd.DataFrame,
    conversations: Sequence[str],
    lexicon: vad.VadLexicon | None,
    classifier: era.PairClassifier | None,
) -> pd.DataFrame:
    """`frame` (with `response`) plus the AE distances and ERA levels that are enabled."""
    out = frame.drop(columns=[c for c in frame if c.startswith(("vad_", "era_"))])
    responses = out["response"].tolist()
    if lexicon is not None:
        ae = [lexicon.distance(c, r) for c, r in zip(conversations, responses, strict=True)]
        out = pd.concat([out, pd.DataFrame(ae, index=out.index)], axis=1)
    if classifier is not None:
        utterances = [speaker_utterance(c) for c in conversations]
        levels = era.score_pairs(classifier, utterances, responses).set_index(out.index)
        out = pd.concat([out, levels], axis=1)
    return out


def write_responses(
    model: Engine, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]
) -> pd.DataFrame:
    """The run's step: generate with `model` the responses `responses.parquet` lacks (saved as
    they come), score every response (AE and ERA where enabled, one line where not) and write
    the table; returned."""
    options = manifest["responses"]  # what `--responses` needs after the run
    data = load_jaem(options["data"], options["templates"])
    if manifest.get("data_sha256") not in (None, data.sha256):
        raise ProbekitError(
            f"the JaEm-ST data found now differ from the run's ({run_dir}); give the same "
            f"{named('data')} and {named('templates')} to write its responses"
        )
    samples = sample_table(scores, [d.column for d in data.dimensions])
    items = response_items(data, samples)
    budget = options["max_new_tokens"]
    key = response_key(manifest, [i.id for i in items])
    path = run_dir / RESPONSES_FILE
    frame = _resume(path, samples, items, key, budget)
    todo = frame["response"].isna().to_numpy()
    if todo.any():
        missing = [i for i, t in zip(items, todo, strict=True) if t]
        print(f"responses: {len(missing)} free continuations ({budget} new tokens)")
        where = frame.index[todo]

        def save(done: list[str]) -> None:
            frame.loc[where[: len(done)], "response"] = done
            write_rows(path, frame, key)

        generate_responses(model, missing, budget, save)
    by_name = {t.name: t for t in data.templates}
    records = samples.to_dict("records")
    conversations = [response_text(data, by_name[r["template"]], r, True) for r in records]
    lexicon = classifier = None
    if options["vad_lexicon"]:
        lexicon = vad.read_vad_lexicon(options["vad_lexicon"])
    else:
        print(ae_skip_message())
    if options["era_model"]:
        classifier = era.load_classifier(options["era_model"], options["device"])
    else:
        print(era.skip_message())
    frame = score_responses(frame, conversations, lexicon, classifier)
    write_rows(path, frame, key)
    return frame


def read_responses(
    scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]
) -> pd.DataFrame | None:
    """The report's view of the responses the run wrote: the rows of `responses.parquet` that
    hold one (None when none does), with one line saying what is missing (the run generates
    them: the same command again resumes it)."""
    ids = [response_id(row) for row in sample_table(scores, []).to_dict("records")]
    again = "run the same command again to generate them"
    try:
        key = response_key(manifest, ids)
        found = read_rows(run_dir / RESPONSES_FILE, key, keep=True, require=["response"])
    except FileNotFoundError:
        echo(f"responses: none written yet; {again}")
        return None
    except Unusable as unusable:
        echo(f"responses: {RESPONSES_FILE} {unusable.describe()}; {again}")
        return None
    frame = found.table.to_pandas()
    frame = frame[frame["response"].notna()].reset_index(drop=True)
    if len(frame) < len(ids):
        echo(f"responses: {len(ids) - len(frame)} of {len(ids)} samples have none yet; {again}")
    return frame if len(frame) else None


def _resume(
    path: Path, samples: pd.DataFrame, items: Sequence[Item], key: RowKey, budget: int
) -> pd.DataFrame:
    """`samples` with `prompt_id`, `response_tokens` and `response`, the latter taken from the
    rows of an earlier `responses.parquet` that are this run's (`probekit.core.store`; else
    missing)."""
    empty = pd.Series([None] * len(samples), dtype=object)
    ids = [item.id for item in items]
    frame = samples.assign(**{PROMPT_ID: ids}, response_tokens=budget, response=empty)
    found = take_rows(path, key, "its responses are generated again", keep=True)
    if found is None or found.table is None or "response" not in found.table.column_names:
        return frame
    old = found.table.column("response").to_pylist()
    for index, response in zip(found.indices, old, strict=True):
        if response is not None:
            frame.at[int(index), "response"] = response
    return frame
