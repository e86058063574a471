"""The repository's Markdown pages link only to files and headings that exist.

Relative links (``[text](docs/architecture.md#how-the-source-is-layered)``) are
resolved against the page's directory; an anchor must be the GitHub slug of a
heading of the target page. Links inside fenced code blocks, and links to other
sites, are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *(ROOT / "docs").glob("*.md"),
        ROOT / "deploy" / "examples" / "README.md",
        ROOT / "deploy" / "helm" / "fractional-gpu-dra" / "README.md",
    ]
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def prose(text: str) -> str:
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", prose(page.read_text()), re.MULTILINE)
    return {slug(h) for h in headings}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading with that anchor")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_somewhere(page: Path) -> None:
    assert not broken_links(page), f"{page.relative_to(ROOT)}: {broken_links(page)}"


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## How it `works`, in short\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n[ok](other.md#how-it-works-in-short) [self](#page) [web](https://x.y/z)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere)\n"
        "```\n[in code](not-checked.md)\n```\n"
    )
    assert slug("How it `works`, in short") == "how-it-works-in-short"
    found = broken_links(page)
    assert len(found) == 2 and found[0].startswith("missing.md") and "nowhere" in found[1]
