"""Carl's free response (`--responses`) and its AE and ERA scores, one row per sample.

The prompt is `prompts.json` AE[0] (empty in the authors' data: no instruction) followed by the
context and the conversation, which ends with `Carl:`; it is filled like the CE prompt and sent
as the single user message (the model's chat template). The paper gives no decoding settings:
probekit decodes greedily (`Scorer` with a generation budget) up to `RESPONSE_TOKENS` new tokens,
stopping at end of sequence.

AE is the per-dimension VAD distance (`vad.py`) between the filled conversation and the response;
ERA scores the pair (Jane's last utterance, the response) with a pair classifier (`era.py`).
`responses.parquet` holds the sample's key columns, `response`, `response_tokens` (the budget),
`vad_*` and `era_*`; it is written every `CHUNK` samples, so a run stopped while generating
resumes from the samples it already holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

import probekit.studies.jaem_st.era as era
import probekit.studies.jaem_st.vad as vad
from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.io import write_parquet
from probekit.core.items import Item, fill_template
from probekit.core.options import given, named
from probekit.engines import load_engine
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


@dataclass(frozen=True)
class ResponseOptions:
    """What `--responses` needs after the run, kept in the manifest (`responses`)."""

    data: str | None
    templates: str | None
    vad_lexicon: str | None
    era_model: str | None
    device: str | None
    max_new_tokens: int = RESPONSE_TOKENS

    def manifest(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_manifest(cls, fields: dict[str, Any]) -> ResponseOptions:
        return cls(**fields)


def response_text(data: JaemData, template: Template, values: dict[str, str]) -> str:
    """AE[0] + context + conversation, filled with the sample's values by mask."""
    instruction = (data.prompts.get("AE") or [""])[0]
    by_mask = {d.mask: str(values[d.column]) for d in data.dimensions}
    return fill_template(instruction + template.context + template.conversation, **by_mask)[0]


def conversation_text(data: JaemData, template: Template, values: dict[str, str]) -> str:
    """The filled conversation: the AE source text."""
    by_mask = {d.mask: str(values[d.column]) for d in data.dimensions}
    return fill_template(template.conversation, **by_mask)[0]


def speaker_utterance(conversation: str) -> str:
    """Jane's last line without its speaker name: the 'seeker post' of the ERA pair."""
    lines = [line for line in conversation.splitlines() if line.startswith(SPEAKER)]
    return lines[-1][len(SPEAKER) :].strip() if lines else conversation.strip()


def sample_table(scores: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """One row per sample (its first prompt): `sample`, `template` and the dimension columns."""
    keys = ["sample", "template", *columns]
    return scores.drop_duplicates("sample")[keys].sort_values("sample").reset_index(drop=True)


def response_items(data: JaemData, samples: pd.DataFrame) -> list[Item]:
    """The response prompt of every sample, as one user message."""
    by_name = {t.name: t for t in data.templates}
    items = []
    for row in samples.to_dict("records"):
        text = response_text(data, by_name[row["template"]], row)
        message = {"role": "user", "content": text}
        item_id = f"{row['template']}|{row['sample']}|response"
        items.append(Item(id=item_id, key=row, unit=str(row["sample"]), messages=(message,)))
    return items


def generate_responses(
    model: Engine,
    items: Sequence[Item],
    max_new_tokens: int,
    save: Callable[[list[str]], None] | None = None,
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
        if save is not None:
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


def generate_missing(
    scores: pd.DataFrame,
    run_dir: Path,
    manifest: dict[str, Any],
    say: Callable[..., None],
    model: Engine | None = None,
) -> tuple[ResponseOptions, Any, pd.DataFrame, pd.DataFrame]:
    """Generate the responses `responses.parquet` lacks (with `model`, else the run's model
    loaded again) and save them; return the options, the data, the samples and the table."""
    options = ResponseOptions.from_manifest(manifest["responses"])
    data = load_jaem(options.data, options.templates)
    if manifest.get("data_sha256") not in (None, data.sha256):
        raise ProbekitError(
            f"the JaEm-ST data found now differ from the run's ({run_dir}); give the same "
            f"{named('data')} and {named('templates')} to write its responses"
        )
    samples = sample_table(scores, [d.column for d in data.dimensions])
    path = run_dir / RESPONSES_FILE
    frame = _resume(path, samples, options.max_new_tokens)
    todo = frame["response"].isna().to_numpy()
    if todo.any():
        items = [i for i, t in zip(response_items(data, samples), todo, strict=True) if t]
        say(f"responses: {len(items)} free continuations ({options.max_new_tokens} new tokens)")
        model = model or load_engine(manifest["model"], device=options.device)
        where = frame.index[todo]

        def save(done: list[str]) -> None:
            frame.loc[where[: len(done)], "response"] = done
            write_parquet(path, frame)

        generate_responses(model, items, options.max_new_tokens, save)
    return options, data, samples, frame


def responses_table(
    scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any], say: Callable[..., None]
) -> pd.DataFrame:
    """Every response (generated first where missing), scored; written and returned."""
    options, data, samples, frame = generate_missing(scores, run_dir, manifest, say)
    by_name = {t.name: t for t in data.templates}
    records = samples.to_dict("records")
    conversations = [conversation_text(data, by_name[r["template"]], r) for r in records]
    lexicon = vad.read_vad_lexicon(options.vad_lexicon) if options.vad_lexicon else None
    classifier = None
    if options.era_model:
        classifier = era.load_classifier(options.era_model, options.device)
    if lexicon is None:
        say(ae_skip_message())
    if classifier is None:
        say(era.skip_message())
    frame = score_responses(frame, conversations, lexicon, classifier)
    write_parquet(run_dir / RESPONSES_FILE, frame)
    return frame


def _resume(path: Path, samples: pd.DataFrame, budget: int) -> pd.DataFrame:
    """`samples` with `response_tokens` and `response`, the latter taken from an earlier
    `responses.parquet` where the sample's key columns and budget match (else missing)."""
    empty = pd.Series([None] * len(samples), dtype=object)
    frame = samples.assign(response_tokens=budget, response=empty)
    if not path.is_file():
        return frame
    old = pd.read_parquet(path)
    keys = [*samples.columns, "response_tokens"]
    if not set(keys) | {"response"} <= set(old.columns):
        return frame
    old = old[old["response"].notna()].drop_duplicates(keys)
    merged = frame.drop(columns="response").merge(old[[*keys, "response"]], on=keys, how="left")
    return merged.astype({"response": object})
