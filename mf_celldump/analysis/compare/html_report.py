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
from typing import Any, Dict, Iterator

from mf_celldump.fsutil import write_new_text

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")


def _asset(name: str) -> str:
    with open(os.path.join(ASSETS, name), encoding="utf-8") as handle:
        return handle.read()


_ROWS = "@@table rows@@"
ROW_BATCH = 200  # rows encoded at a time


def _json(value: Any) -> str:
    # inside <script>, "</" could end the block and "<!--" open a comment: escape them
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--")


def page_chunks(data: Dict[str, Any]) -> Iterator[str]:
    """The page for ``data`` (JSON-ready, as :func:`report_data.report_data` returns it), in pieces:
    the rows of ``data["table"]["rows"]`` (any iterable of lists) are written one at a time."""
    table = data.get("table") or {}
    rows = table.get("rows", [])
    payload = _json({**data, "table": {**table, "rows": _ROWS}}) if table else _json(data)
    page = _asset("report.html").replace("{{style}}", _asset("report.css")).replace("{{script}}", _asset("report.js"))
    before_data, _, after_data = page.partition("{{data}}")
    before_rows, marker, after_rows = payload.partition(json.dumps(_ROWS))
    yield before_data + before_rows
    if marker:
        yield "["
        batch, first = [], True
        for row in rows:
            batch.append(row)
            if len(batch) == ROW_BATCH:
                yield ("" if first else ",") + _json(batch)[1:-1]
                batch, first = [], False
        if batch:
            yield ("" if first else ",") + _json(batch)[1:-1]
        yield "]"
    yield after_rows + after_data


def write_html(path: str, data: Dict[str, Any]) -> None:
    """Write the page beside ``path`` and rename it into place (never seen half-written)."""
    partial = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.partial")
    if os.path.lexists(partial):  # left by an interrupted run of ours
        os.unlink(partial)
    write_new_text(partial, page_chunks(data))
    os.replace(partial, path)
