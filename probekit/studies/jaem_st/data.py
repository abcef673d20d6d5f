"""JaEm-ST's data: conversation templates, social dimensions, CE prompts, read as the authors do.

A template file is a causal tuple (never shown to the model), then `Context:`, `Conversation:` and
`Answers:` sections. The files are read in text mode (universal newlines, as the authors' `open`),
split at the three headers, which are dropped, and kept otherwise verbatim: the context piece of
`sample2` starts with the space that follows its `Context:`. The answers block has its newlines
removed and each answer keeps the label written before it (the authors' `split_answers` attaches
some labels to the wrong texts; see README.md).

Masks (`{GENDER}`, ...) map to dimensions through `dataset_metadata.json` (`format_dims[i]` is the
mask of `social_groups[i]`); the values come from `dimensions.json`. Table columns name a
dimension by its mask in lower case (`socecon` for "socio-economic status").
"""

from __future__ import annotations

import hashlib
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.paths import file_sha256
from probekit.core.text import read_json, read_text
from probekit.datasets.locate import Dataset, DataSource, combined_sha256

FOLDER = "jaem_st"
TEMPLATE_FILES = ("sample1_worker_exploitation.txt", "sample2_gift_hapiness.txt")
REQUIRED = (
    f"{FOLDER}/dataset_metadata.json",
    f"{FOLDER}/dimensions.json",
    f"{FOLDER}/prompts.json",
    *(f"{FOLDER}/templates/{name}" for name in TEMPLATE_FILES),
)
JAEM_ST = Dataset("JaEm-ST", REQUIRED)  # no probekit-written sample stands in for it
HEADERS = ("Context:", "Conversation:", "Answers:")
EMPATHETIC = "Empathetic"
_LABEL = re.compile(r"^([^\s:]+): ")


@dataclass(frozen=True)
class Template:
    """One conversation template: its pieces as the authors join them, and its true labels."""

    index: int  # position in sorted file order: the authors' `sample_index`
    name: str  # file name without `.txt`
    causal_tuple: str
    context: str
    conversation: str
    answers: tuple[tuple[str, str], ...]  # (label, text) in file order

    @property
    def masks(self) -> tuple[str, ...]:
        """The mask names used anywhere in the shown text, in first-use order."""
        text = self.context + self.conversation + "".join(t for _, t in self.answers)
        return tuple(
            dict.fromkeys(
                name for _, name, _, _ in string.Formatter().parse(text) if name is not None
            )
        )

    def answer_index(self, label: str) -> int:
        """Position (file order) of the answer with `label`."""
        return [lab for lab, _ in self.answers].index(label)


@dataclass(frozen=True)
class Dimension:
    """A social dimension: its name in dimensions.json, its mask, its values."""

    name: str
    mask: str
    values: tuple[str, ...]

    @property
    def column(self) -> str:
        return self.mask.lower()


@dataclass(frozen=True)
class JaemData:
    """Everything one run reads: templates, dimensions, prompts and the sampling metadata."""

    templates: tuple[Template, ...]
    dimensions: tuple[Dimension, ...]  # in the metadata's `social_groups` order
    prompts: dict[str, list[str]]
    answer_labels: tuple[str, ...]
    evaluated: tuple[str, ...]  # names of the dimensions in the Cartesian product
    dataset_size: int
    source: DataSource  # where the data root was found
    folder: Path  # the templates' folder
    sha256: str  # the data files and the templates read, for the manifest's `data_sha256`

    def dimension(self, name_or_column: str) -> Dimension:
        for dim in self.dimensions:
            if name_or_column in (dim.name, dim.column, dim.mask):
                return dim
        known = ", ".join(d.column for d in self.dimensions)
        raise ProbekitError(f"unknown social dimension {name_or_column!r}; choose from {known}")

    def shown_dimensions(self, template: Template) -> tuple[Dimension, ...]:
        """The dimensions whose mask reaches this template's prompt."""
        return tuple(d for d in self.dimensions if d.mask in template.masks)


def parse_template(text: str, index: int, name: str, labels: tuple[str, ...]) -> Template:
    """Split a template's text (newlines already `\\n`) into its pieces; check the answers."""
    pattern = "|".join(map(re.escape, HEADERS))
    if re.findall(pattern, text) != list(HEADERS):
        missing = [f"no '{h}' section header" for h in HEADERS if h not in text]
        order = f"sections must come once each, as {', '.join(HEADERS)}"
        raise ProbekitError(f"template {name}: {(missing or [order])[0]}")
    causal, context, conversation, block = re.split(pattern, text)
    return Template(
        index, name, causal.strip(), context, conversation, _answers(block, name, labels)
    )


def _answers(block: str, name: str, labels: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(label, text) pairs: a line `Label: text` starts an answer, other lines continue it with
    no separator (the authors remove the block's newlines)."""
    found: list[list[str]] = []
    for line in block.split("\n"):
        match = _LABEL.match(line)
        if match:
            label = match.group(1)
            if label not in labels:
                raise ProbekitError(
                    f"template {name}: answer label {label!r} is not one of {', '.join(labels)}"
                )
            found.append([label, line[match.end() :]])
        elif line:
            if not found:
                raise ProbekitError(f"template {name}: text before the first answer label")
            found[-1][1] += line
    seen = [label for label, _ in found]
    if sorted(seen) != sorted(labels):
        raise ProbekitError(
            f"template {name}: the answers must carry each of {', '.join(labels)} once "
            f"(found {', '.join(seen) or 'none'})"
        )
    return tuple((label, text) for label, text in found)


def _dimensions(metadata: dict[str, Any], values: dict[str, Any]) -> tuple[Dimension, ...]:
    names, masks = metadata.get("social_groups"), metadata.get("format_dims")
    if not isinstance(names, list) or not isinstance(masks, list) or len(names) != len(masks):
        raise ProbekitError("dataset_metadata.json needs social_groups and format_dims, aligned")
    dims = []
    for name, mask in zip(names, masks, strict=True):
        vals = values.get(name)
        if not isinstance(vals, list) or not vals:
            raise ProbekitError(f"mask {{{mask}}}: dimensions.json has no values for {name!r}")
        dims.append(Dimension(name, mask, tuple(str(v) for v in vals)))
    return tuple(dims)


def load_jaem(
    data: str | Path | DataSource | None = None, templates: str | Path | None = None
) -> JaemData:
    """Read JaEm-ST from `data`: where `JAEM_ST` was found (the study's `data_source`), or the
    data root to find it from (`--data`, else `$PROBEKIT_DATA`, cache or pinned download);
    `templates` replaces its templates folder (every `*.txt`, sorted by name)."""
    source = data if isinstance(data, DataSource) else JAEM_ST.resolve(data)
    root = source.path / FOLDER
    metadata = read_json(root / "dataset_metadata.json")
    dims = _dimensions(metadata, read_json(root / "dimensions.json"))
    prompts = read_json(root / "prompts.json")
    labels = tuple(metadata.get("answer_dims", ()))
    if EMPATHETIC not in labels:
        raise ProbekitError(f"dataset_metadata.json: answer_dims must include {EMPATHETIC!r}")
    folder = Path(templates) if templates is not None else root / "templates"
    files = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    if not files:
        raise ProbekitError(f"{folder} holds no template (*.txt)")
    parsed = tuple(
        parse_template(read_text(path), i, path.stem, labels) for i, path in enumerate(files)
    )
    masks = {d.mask for d in dims}
    for template in parsed:
        unknown = [m for m in template.masks if m not in masks]
        if unknown:
            raise ProbekitError(
                f"template {template.name}: mask {{{unknown[0]}}} has no values in the "
                "dimensions file (no dimension of dataset_metadata.json uses it)"
            )
    evaluated = tuple(dims[i].name for i in metadata.get("evaluated_dims", []))
    rel = [r for r in REQUIRED if "/templates/" not in r]
    parts = [combined_sha256(source.path, rel), *(file_sha256(p) for p in files)]
    digest = hashlib.sha256("".join(parts).encode()).hexdigest()
    size = int(metadata.get("dataset_size", 400))
    return JaemData(parsed, dims, prompts, labels, evaluated, size, source, folder, digest)
