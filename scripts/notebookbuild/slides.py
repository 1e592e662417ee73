"""``--slides``: static reveal.js slides of the committed, executed notebooks (their saved outputs; nothing runs)."""

from __future__ import annotations

from pathlib import Path

import nbformat


def export_slides(notebooks: list[Path], folder: Path, reveal_prefix: str | None) -> None:
    """Write static reveal.js slides ``<folder>/<stem>.slides.html`` from the committed, executed ``notebooks``.

    The slides show the saved outputs and widget views; nothing runs. reveal.js loads from ``reveal_prefix``
    (default: nbconvert's CDN address; give a local copy's folder to present offline).
    """
    from nbconvert import SlidesExporter  # slow to import, and only this mode needs it

    folder.mkdir(parents=True, exist_ok=True)
    exporter = SlidesExporter()
    exporter.exclude_input_prompt = True
    exporter.exclude_output_prompt = True
    if reveal_prefix:
        exporter.reveal_url_prefix = reveal_prefix
    for path in notebooks:
        body, _ = exporter.from_notebook_node(nbformat.read(path, as_version=4))
        target = folder / f"{path.stem}.slides.html"
        target.write_text(body, encoding="utf-8")
        print(f"wrote {target}")
