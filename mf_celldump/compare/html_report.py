"""``report.html``: one self-contained page (no network, no build step) showing a comparison.

The data is the JSON of :func:`report_data.report_data`, embedded in a
``<script type="application/json">`` block; plain JavaScript in the page draws the
verdict, the coverage, the first divergence with its inputs and parents, the weights,
the per-layer chart (SVG, forward and backward, dashed threshold lines), a ranks x layers
heat map when several ranks were compared, and a sortable, filterable table of pairs
(``#filter=TEXT&status=diverged`` in the address pre-sets the filter). Names from the
dumps are inserted as text, never as markup. The page, its style and its script are the
files in ``assets/`` (plain HTML, CSS and JavaScript), inlined here.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict

from mf_celldump.fsutil import atomic_write_bytes

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")


def _asset(name: str) -> str:
    with open(os.path.join(ASSETS, name), encoding="utf-8") as handle:
        return handle.read()


def render_html(data: Dict[str, Any]) -> str:
    """The page for ``data`` (JSON-ready, as :func:`report_data.report_data` returns it)."""
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
    # inside <script>, "</" could end the block and "<!--" open a comment: escape them
    payload = payload.replace("</", "<\\/").replace("<!--", "<\\u0021--")
    page = _asset("report.html").replace("{{style}}", _asset("report.css")).replace("{{script}}", _asset("report.js"))
    return page.replace("{{data}}", payload)


def write_html(path: str, data: Dict[str, Any]) -> None:
    atomic_write_bytes(path, render_html(data).encode("utf-8"), fsync=False)
