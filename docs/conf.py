"""Sphinx configuration of the fbands documentation.

Build (from the repository root; ``make docs`` and ``make test`` run these):

    python -m sphinx -W --keep-going -b html docs docs/_build/html
    python -m sphinx -W --keep-going -b doctest docs docs/_build/doctest

Generated pages (the divergence catalogue, the benchmark tables, the toctrees of the optional
parts) are written to ``docs/_generated/`` by the local extension ``_ext/fbands_docs.py``.
"""

from __future__ import annotations

import doctest
import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# The checkout's own fbands, whether or not it is installed.
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))
os.environ.setdefault("MPLBACKEND", "Agg")

import fbands_docs  # noqa: E402

# The version of the checkout: fbands/__init__.py's __version__ (pyproject.toml reads it from
# there too), found without importing the package.
_version = re.search(
    r'^__version__\s*=\s*"([^"]+)"',
    (ROOT / "fbands" / "__init__.py").read_text(encoding="utf-8"),
    re.M,
)

project = "fbands"
author = "fbands developers"
copyright = "2026, fbands developers"  # noqa: A001
release = _version.group(1) if _version else "unknown"
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    # MathJax 3 itself (scripts and fonts) from the PyPI package, copied into _static/mathjax at
    # the end of the build: the pages render their formulas with no network.
    "sphinx-mathjax-offline",
    "fbands_docs",
    # the picture of the modules and their imports (docs/theory/implementation.md)
    "fbands_graph",
]
# Set here too (the extension also sets it): the bundled copy, never a CDN.
mathjax_path = "mathjax/tex-chtml.js"

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "Thumbs.db", ".DS_Store", "README.md"]
# API pages of parts that are not in this checkout are left out (see fbands_docs.API_PAGES).
exclude_patterns += fbands_docs.excluded_documents()

# -- MyST ------------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# -- autodoc / napoleon ----------------------------------------------------------------------
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
# Third-party packages that a module imports at module level (found by reading the sources:
# verl and omegaconf, trl, transformers, ...): the pages are built without those that are not
# installed, so the docs extra alone builds every page.
autodoc_mock_imports = [
    name for name in fbands_docs.third_party_imports() if not fbands_docs.module_exists(name)
]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

# -- doctest ---------------------------------------------------------------------------------
doctest_global_setup = """
import numpy as np
import fbands
"""
doctest_default_flags = (
    doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.DONT_ACCEPT_TRUE_FOR_1
)

# -- HTML ------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"fbands {release}"
html_theme_options = {"navigation_with_keys": True}
pygments_style = "friendly"
pygments_dark_style = "monokai"
