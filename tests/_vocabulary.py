"""The metric names of docs/guides/metrics.md, which every trainer's tests check against."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "metrics.md"


def vocabulary() -> set[str]:
    """Every name in the first column of the page's table."""
    names = set()
    for line in PAGE.read_text().splitlines():
        if line.startswith("| `band/"):
            names |= set(re.findall(r"`(band/[a-z0-9_]+)`", line.split("|")[1]))
    return names
