"""The commands without a study: `probekit score` (the function `probekit.score_file`),
`probekit setup`, `probekit plan` (`probekit.plan`) and `probekit studies`; each reads its
options through the one runner (`probekit.run.command.Runner`) and calls its function.
`probekit.engines.load_engine` is looked up when called (tests replace it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probekit import engines
from probekit.core.errors import ProbekitError
from probekit.core.kinds import path
from probekit.core.options import REQUIRED, option, option_values
from probekit.engines.options import ScoreOptions
from probekit.engines.plan import PlanOptions, marked_plan
from probekit.run.command import Options, Runner
from probekit.run.score import check_scores_file, score_file
from probekit.studies import list_studies
from probekit.studies.base import Study


@dataclass(frozen=True, kw_only=True)
class ScoreFiles(ScoreOptions):
    """Scoring: the prompts read, the table written, the answers, how each prompt is scored."""

    prompts: Path = option(REQUIRED, help='JSONL: {"id", "messages"} or {"id", "text"}', kind=path)
    scores: Path = option(REQUIRED, help="the Parquet file written (atomically)", kind=path)


class ScoreCommand(Runner):
    """`probekit score`: `probekit.score_file` on the command line."""

    name, own = "score", ScoreFiles

    def check(self, options: Options, study: Study | None) -> None:
        check_scores_file(options.own.scores)

    def elsewhere(self, name: str) -> str | None:
        """`--out` (score's file until it was named `--scores`) names a run folder elsewhere."""
        if name == "out":
            return "--out names a run folder; probekit score writes one Parquet file: --scores FILE"
        return None

    def main(self, options: Options, study: Study | None = None) -> None:
        model = options.model
        keywords = option_values(options.own)
        written = score_file(model.model, **keywords, quiet=model.quiet, **model.load_keywords())
        print(f"wrote {written}")


class SetupCommand(Runner):
    """`probekit setup`: the model loaded once (the default model converted and cached)."""

    name = "setup"

    def main(self, options: Options, study: Study | None = None) -> None:
        model = options.model
        engine = engines.load_engine(model.model, **model.load_keywords())
        print(f"model '{model.model}' ready: {engine.describe()['model_source']}")


class PlanCommand(Runner):
    """`probekit plan`: `probekit.plan`'s lines (or JSON); one line and exit status 2 when the
    model does not fit."""

    name, own, models = "plan", PlanOptions, False

    def main(self, options: Options, study: Study | None = None) -> None:
        own: Any = options.own
        result = marked_plan(**option_values(own, leave=("json",)))  # worded at the edge
        shown = json.dumps(result.to_dict(), indent=1, ensure_ascii=False)  # marks kept
        print(shown if own.json else "\n".join(result.lines()))
        if not result.fits:
            raise ProbekitError(result.advice)


class StudiesCommand(Runner):
    """`probekit studies`: one line per registered study."""

    name, models = "studies", False

    def main(self, options: Options, study: Study | None = None) -> None:
        studies = list_studies()
        width = max(len(study.name) for study in studies)
        for study in studies:
            print(f"{study.name:<{width}}  {study.title}")


SCORE, SETUP, PLAN, STUDIES = ScoreCommand(), SetupCommand(), PlanCommand(), StudiesCommand()
