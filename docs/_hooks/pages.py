"""MkDocs hook: a page another part of the project writes (listed below) but that is not in the
checkout yet is built as a one-paragraph placeholder, so that the navigation and the links to it
hold while it is being written. A page that exists is never touched."""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

PENDING = {
    "running.md": "Running studies",
    "mechanism.md": "The mechanism guide",
    "steering.md": "Steering",
    "integrity.md": "Integrity of inputs",
    "scale.md": "Scale",
}


def on_files(files: Files, config: Any) -> Files:
    for path, title in PENDING.items():
        if files.get_file_from_path(path) is None:
            text = f"# {title}\n\nThis page is being written.\n"
            files.append(File.generated(config, path, content=text))
    return files
