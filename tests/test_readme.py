"""The README and its reference pages: links that resolve, a first screen that orients, tables
rendered from the code they document."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FIRST_SCREEN = 40
"""Lines a reader sees before scrolling."""

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _prose(path: Path) -> str:
    return _FENCE.sub("", path.read_text())


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", _prose(path), re.M)}


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for target in _LINK.findall(_prose(page)):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_the_first_screen_has_the_set_up_commands_and_contents_for_every_section():
    lines = README.read_text().splitlines()
    first = "\n".join(lines[:FIRST_SCREEN])
    assert "make cycle" in first and "make test" in first
    assert "**Contents**" in first
    linked = {t.partition("#")[2] for t in _LINK.findall(first) if t.startswith("#")}
    sections = {_slug(h) for h in re.findall(r"^## (.+)$", _prose(README), re.M)}
    assert sections - linked == set(), "sections missing from the contents"
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in first, f"{page.name} is not linked from the first screen"


def test_layout_comes_right_after_quickstart():
    sections = re.findall(r"^## (.+)$", _prose(README), re.M)
    assert sections[0].startswith("Quickstart") and sections[1] == "Layout"


def test_the_filled_parameters_table_is_rendered_from_the_bot_loader():
    from pipecat_rl.simulator.botloader import FILLED_PARAMETERS

    page = (ROOT / "docs" / "cli.md").read_text()
    start = page.index("<!-- filled-parameters:")
    block = page[page.index("\n", start) + 1 : page.index("<!-- /filled-parameters -->")]
    rows = [f"| `{name}` | {value} |" for name, value in FILLED_PARAMETERS.items()]
    expected = "\n".join(["| parameter | value |", "|---|---|", *rows])
    assert block.strip() == expected, f"docs/cli.md's table is stale; paste in:\n{expected}"
