"""``report.html`` of ``mf-celldump compare``: self-contained, and working in a real headless Chromium.

The page is checked as a file (no network reference, the data block cannot be closed by
a name from a dump) and in Debian's Chromium driven over the DevTools protocol
(tests/support/chromium.py): it loads with no console error, shows the first divergence,
its table filters (typed and from the address) and sorts, the heat map has a row per
rank, the charts carry threshold lines, and a screenshot is not blank. Without Chromium
the browser tests skip and say how to install it.
"""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

from mf_celldump.analysis.compare.html_report import page_chunks
from mf_celldump.cli import main as celldump_main
from tests.support.chromium import Browser, needs_chromium
from tests.support.compare_dumps import chain, write_dump


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Two ranks compared; rank 1's fc2 is scaled by 1.5, so the heat map has something to show."""
    root = tmp_path_factory.mktemp("html")
    for rank in ("rank0", "rank1"):
        write_dump(str(root / "base"), chain(1.0), rank=rank)
        write_dump(str(root / "run"), chain(1.5 if rank == "rank1" else 1.0), rank=rank)
    code = celldump_main(["compare", str(root / "run"), str(root / "base"), "-o", str(root / "out"), "--json"])
    assert code == 1
    return str(root / "out" / "report.html")


def test_the_page_is_self_contained(report):
    with open(report, encoding="utf-8") as handle:
        page = handle.read()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "a network reference"
    assert "default-src 'none'" in page  # the browser refuses to fetch anything
    data = json.loads(page.split('<script id="report-data" type="application/json">', 1)[1].split("</script>", 1)[0])
    assert data["first"]["cell"] == "block.fc2" and data["first"]["rank"] == 1
    assert data["heatmap"]["rows"] == ["step0/rank0", "step0/rank1"]


def test_a_name_from_a_dump_cannot_end_the_data_block():
    page = "".join(page_chunks({"name": "</script><script>alert(1)</script><!--"}))
    block = page.split('<script id="report-data" type="application/json">', 1)[1]
    assert block.index("</script>") > block.index("alert")  # the first </script> is the block's own end
    assert json.loads(block.split("</script>", 1)[0]) == {"name": "</script><script>alert(1)</script><!--"}


@pytest.fixture(scope="module")
def page(report):
    with Browser() as browser:
        yield browser.open("file://" + report)


@needs_chromium
def test_loads_without_console_errors_and_names_the_first_divergence(page):
    assert page.evaluate("document.body.getAttribute('data-ready')") == "1"
    assert page.errors == []
    headline = page.evaluate("document.getElementById('headline').textContent")
    assert headline == "FIRST DIVERGENCE (forward, step 0 rank 1): Cell.block.fc2.Dense.forward.0"
    assert page.evaluate("document.getElementById('first-text').textContent").startswith("block.fc2 (forward")
    parents = page.evaluate("document.getElementById('parents').textContent")
    assert "block diverged: diverged at output.0" in parents


@needs_chromium
def test_the_table_filters_and_sorts(page):
    total = page.evaluate("document.querySelectorAll('#pairs-body tr').length")
    assert total == 12  # 2 ranks x 3 entries x (input, output)
    page.evaluate("var f = document.getElementById('filter'); f.value = 'fc2 rank1'; "
                  "f.dispatchEvent(new Event('input'))")
    rows = page.evaluate("Array.from(document.querySelectorAll('#pairs-body tr')).map(r => r.textContent)")
    assert len(rows) == 2 and all("fc2" in r and "rank1" in r for r in rows)
    assert page.evaluate("document.getElementById('count').textContent").startswith("2 matching pairs")
    page.evaluate("var f = document.getElementById('filter'); f.value = ''; f.dispatchEvent(new Event('input'));"
                  "var s = document.getElementById('status-filter'); s.value = 'diverged';"
                  "s.dispatchEvent(new Event('change'))")
    statuses = page.evaluate("Array.from(document.querySelectorAll('#pairs-body td.s-diverged')).length")
    assert statuses == page.evaluate("document.querySelectorAll('#pairs-body tr').length") == 2
    page.evaluate("var s = document.getElementById('status-filter'); s.value = '';"
                  "s.dispatchEvent(new Event('change'));"
                  "Array.from(document.querySelectorAll('#pairs-head th')).find(t => t.textContent === 'rel_err')"
                  ".click()")
    column = page.evaluate("Array.from(document.querySelectorAll('#pairs-head th')).findIndex("
                           "t => t.textContent === 'rel_err')")
    values = page.evaluate(f"Array.from(document.querySelectorAll('#pairs-body tr')).map(r => "
                           f"parseFloat(r.children[{column}].textContent))")
    assert values == sorted(values)


@needs_chromium
def test_the_address_presets_the_filter(report):
    with Browser() as browser:
        page = browser.open("file://" + report + "#status=diverged&filter=fc2")
        rows = page.evaluate("Array.from(document.querySelectorAll('#pairs-body tr')).map(r => r.textContent)")
        assert rows and all("diverged" in r and "fc2" in r for r in rows)
        assert page.errors == []


@needs_chromium
def test_heat_map_charts_and_a_screenshot_that_is_not_blank(page):
    import matplotlib.image

    assert page.evaluate("document.querySelectorAll('#heatmap table.heat').length") == 2  # forward, backward
    assert page.evaluate("Array.from(document.querySelectorAll('#heatmap td.rowlabel')).map(t => t.textContent)") == [
        "step0/rank0", "step0/rank1"] * 2
    assert page.evaluate("document.querySelectorAll('svg.chart').length") == 2
    assert page.evaluate("document.querySelectorAll('svg.chart line.threshold').length") >= 4
    pixels = matplotlib.image.imread(io.BytesIO(page.screenshot()), format="png")
    assert pixels.shape[0] > 500 and pixels.shape[1] > 500
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]).round(2), axis=0)
    assert len(colours) > 50 and float(pixels[..., :3].std()) > 0.05


def _long_names(entries, prefix="model.a_rather_long_module_name.layers"):
    """The chain with long cell names (the depth groups, hence the chart's x-axis labels, get long)."""
    return {name.replace("Cell.block", f"Cell.{prefix}"): spec for name, spec in entries.items()}


@pytest.fixture(scope="module")
def long_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("html_long")
    write_dump(str(root / "base"), _long_names(chain(1.0)))
    write_dump(str(root / "run"), _long_names(chain(1.5)))
    assert celldump_main(["compare", str(root / "run"), str(root / "base"), "-o", str(root / "out")]) == 1
    return str(root / "out" / "report.html")


CLIPPED_LABELS = """(function () { var out = [];
  document.querySelectorAll('svg.chart').forEach(function (s) { var box = s.getBoundingClientRect();
    s.querySelectorAll('text.xlabel').forEach(function (t) { var r = t.getBoundingClientRect();
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.bottom > box.bottom + 0.5) {
        out.push(t.textContent); } });
  }); return out; })()"""


@needs_chromium
@pytest.mark.parametrize("which", ["report", "long_report"])
def test_at_1280_px_labels_fit_the_status_shows_and_the_first_divergence_leads_the_table(request, which):
    """A 1280 px wide window: no x-axis label is cut off at the chart's edges, the pairs table's status
    column is within the window without scrolling sideways, and its first rows are the first divergence's."""
    with Browser() as browser:
        page = browser.open("file://" + request.getfixturevalue(which), width=1280, height=1000)
        assert page.errors == []
        assert page.evaluate("document.querySelectorAll('svg.chart text.xlabel').length") > 0
        assert page.evaluate(CLIPPED_LABELS) == []
        right, visible = page.evaluate(
            "(function () { var th = Array.from(document.querySelectorAll('#pairs-head th')).find("
            "function (t) { return t.textContent === 'status'; }); return [th.getBoundingClientRect().right, "
            "document.querySelector('.tablewrap').getBoundingClientRect().right]; })()")
        assert right <= min(visible, 1280), (right, visible)
        first = page.evaluate("document.querySelector('#pairs-body tr').textContent")
        name = page.evaluate("JSON.parse(document.getElementById('report-data').textContent).first.name")
        assert name in first and "diverged" in first, (name, first)
