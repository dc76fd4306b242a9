"""The marked blocks of a page: `<!-- generated: NAME -->` (rendered by the report),
`<!-- embed: PATH -->` (a recorded file, fenced) and `<!-- include: PATH -->` (a markdown file
as is), each closed by its end marker; the prose around them is never touched. One syntax for
every page, filled by one function each, so no other code splices a page.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.core.bounded import read_capped
from pipeline.stages.report.data import MAX_FILE_BYTES, ReportError

GENERATED = re.compile(r"<!-- generated: (?P<name>[a-z0-9-]+) -->\n.*?<!-- /generated -->", re.DOTALL)
EMBED = re.compile(r"<!-- embed: (?P<path>\S+) -->\n```(?P<lang>\w*)\n.*?```\n<!-- /embed -->", re.DOTALL)
INCLUDE = re.compile(r"<!-- include: (?P<path>\S+) -->\n.*?<!-- /include -->", re.DOTALL)  # markdown, unfenced
EMBED_ROOTS = ("results", "metrics")


def _no_markers(where: str, body: str) -> str:
    if "<!--" in body or "-->" in body:
        raise ReportError(f"{where}: holds a block marker ('<!--' or '-->'); refusing to embed it")
    return body


def splice(readme: str, bodies: dict[str, str], where: str = "README.md") -> str:
    """`readme` with each `<!-- generated: NAME -->` block's body replaced by `bodies[NAME]`."""

    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in bodies:
            raise ReportError(f"{where}: unknown generated block {name!r} (known: {', '.join(sorted(bodies))})")
        return f"<!-- generated: {name} -->\n{_no_markers(name, bodies[name])}\n<!-- /generated -->"

    return GENERATED.sub(fill, readme)


def _well_formed(text: str) -> None:
    """Refuse an embed marker with no fenced block under it, or an include marker with no end:
    either would be left as it is, silently empty, by the substitutions below."""
    blocks = {m.start() for m in EMBED.finditer(text)} | {m.start() for m in INCLUDE.finditer(text)}
    for marker in re.finditer(r"^<!-- (embed|include): (\S+) -->$", text, re.MULTILINE):
        if marker.start() not in blocks:
            end = "a fenced block (```), then <!-- /embed -->" if marker[1] == "embed" else "<!-- /include -->"
            raise ReportError(f"{marker[1]} {marker[2]!r}: expected {end} after its marker")


def embed(text: str, root: Path) -> str:
    """`text` with every embed block (fenced) and include block (markdown as is) refreshed
    from its file under `root` (the repository)."""

    def read(name: str, fenced: bool) -> str:
        path = (root / name).resolve()
        if not any(path.is_relative_to((root / top).resolve()) for top in EMBED_ROOTS):
            raise ReportError(f"embed {name!r}: only files under {' or '.join(EMBED_ROOTS)}/ may be embedded")
        if not path.is_file():
            raise ReportError(f"embed {name!r}: no such file")
        data = read_capped(path, MAX_FILE_BYTES, "embedded file")
        body = _no_markers(name, data.decode("utf-8", errors="replace").rstrip("\n"))
        if fenced and "```" in body:
            raise ReportError(f"embed {name!r}: holds a code fence (```); refusing to embed it")
        return body

    _well_formed(text)
    text = EMBED.sub(
        lambda m: f"<!-- embed: {m['path']} -->\n```{m['lang']}\n{read(m['path'], True)}\n```\n<!-- /embed -->", text
    )
    return INCLUDE.sub(lambda m: f"<!-- include: {m['path']} -->\n{read(m['path'], False)}\n<!-- /include -->", text)
