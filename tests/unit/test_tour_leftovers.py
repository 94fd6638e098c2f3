"""What the README's and the user guide's commands write into the checkout is ignored by git: following the
tour leaves no untracked files behind (issue 31: "the tour leaves untracked data/ and lr.png")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# An output a documented command writes: export/prepare-data --out PATH, report --plot PATH.
WRITTEN = re.compile(r"--(?:out|plot) ([\w./-]+)")
# What the tour makes beside them, as the README's fine-tuning section names it (tests/cluster/test_readme_tour.py).
TOUR_MADE = ("models/tiny-deepseek", "corpus/doc-000.txt")


def written_paths() -> list[str]:
    pages = [REPO / "README.md", *sorted((REPO / "docs" / "user").glob("*.md"))]
    return sorted({match for page in pages for match in WRITTEN.findall(page.read_text())})


def test_every_path_the_documented_commands_write_is_ignored_by_git():
    paths = written_paths()
    assert {"data/docs.bin", "lr.png", "exported/adapter"} <= set(paths)  # the parse finds what the pages show
    # Absolute paths are the user's own places; DIR, FILE.bin and the like are placeholders, not commands' outputs.
    relative = [p for p in [*paths, *TOUR_MADE] if not p.startswith("/") and not re.match(r"[A-Z_]+\b", p)]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *relative], cwd=REPO, capture_output=True,
                             text=True, timeout=60).stdout.split()
    assert sorted(set(relative) - set(ignored)) == []


def test_the_readme_is_a_start_page_that_begins_with_the_two_commands():
    """Issue 41: the README is a start page (at most 200 lines); its first two commands are the newcomer's: install
    and run a small sweep, then install everything and run the tests, before any section."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"
    commands = [line.strip() for line in lines if line.startswith("    ") and line.strip()]
    first_section = next(n for n, line in enumerate(lines) if line.startswith("## "))
    assert commands[:2] == ["pip install torch==2.13.0 -e . && python -m hpcsweep -m model.lr=1e-4,3e-4",
                            "scripts/test.sh"]
    assert all(lines.index("    " + c) < first_section for c in commands[:2])
