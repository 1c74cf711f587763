"""The HTML report of an eval result: self-contained, every section present, and a browser renders it."""

import base64
import re

import numpy as np
import pytest

from kvlab.report_html import render_html, write_html_report


def test_synthetic_result_follows_the_eval_schema(eval_result):
    from kvlab.eval.schema import validate_result

    assert validate_result(eval_result) == []


def test_page_has_every_section(eval_result):
    page = render_html(eval_result)
    for heading in (
        "Decision",
        "Gates",
        "Candidates",
        "Table: capacity matrix",
        "Table: window matrix",
        "Failures (3)",
        "Figures",
        "Provenance",
        "Settings",
        "Raw data",
    ):
        assert f"<h2>{heading}" in page, heading
    assert eval_result["summary"]["decision"] == "accept kivi-4 at context 2048"
    assert "Decision: <b>accept kivi-4 at context 2048</b>" in page
    assert "synthetic-model" in page  # provenance is shown
    assert "optional extra &#x27;hf&#x27; not installed" in page  # the failure is shown, escaped


def test_decision_says_the_rule_that_chose_it(eval_result):
    """The text report printed how the decision chose among several eligible rows; the HTML page did not."""
    from kvlab.eval.decision_words import decision_rule

    summary = dict(eval_result["summary"], eligible_candidate_count=3, selected_candidate="kivi-4")
    page = render_html(dict(eval_result, summary=summary))
    rule = decision_rule(summary)
    assert rule.startswith("the rule: of the 3 rows that pass every gate") and "within 1%" in rule
    assert rule in page
    single = dict(eval_result, summary=dict(summary, eligible_candidate_count=1))
    assert "the rule:" not in render_html(single)  # one eligible row: nothing was chosen among


def test_settings_show_what_auto_resolved_to(eval_result):
    """The Settings table showed `threads: -` and `device: auto` while the provenance had 1 and cpu."""
    result = dict(eval_result)
    result["settings"] = dict(
        eval_result["settings"], threads=None, device="auto", prompt_mode="heldout", prompt="Hi"
    )
    result["provenance"] = dict(eval_result["provenance"], torch_threads=1)
    result["provenance"]["hardware"] = dict(eval_result["provenance"].get("hardware") or {}, device="cpu")
    page = render_html(result)
    settings = page[page.index("<h2>Settings</h2>") :]
    assert "auto (1 in this run)" in settings and "auto (cpu in this run)" in settings
    assert "Hi (unused: prompt_mode heldout cuts the held-out text)" in settings


def test_page_is_self_contained(eval_result):
    page = render_html(eval_result)
    assert not re.search(r"""(src|href)=["'](https?:|//|file:)""", page)
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 2  # capacity and window figures
    for data in images:
        assert base64.b64decode(data).startswith(b"\x89PNG")


def test_gate_cells_and_verdicts_are_marked(eval_result):
    page = render_html(eval_result)
    assert '<td class="fail">2.20</td>' in page  # kivi-4 and kivi-2 at 4096: latency ratio 2.2 > 2.0
    assert '<td class="pass">1.32</td>' in page  # at 512: 1.325 <= 2.0 (3 significant digits)
    assert (
        '<td class="key fail verdict">rejected</td>' in page
        and '<td class="key pass verdict">eligible</td>' in page
    )
    assert '<td class="key verdict">baseline</td>' in page


def test_row_gate_verdicts_take_precedence(eval_result):
    """The runner's per-row verdict is shown even where the thresholds would say otherwise."""
    row = next(r for r in eval_result["rows"] if r["candidate"] == "kivi-4" and r["context_length"] == 512)
    row["latency_ratio"] = 1.234
    row["gates"]["latency_ratio"] = False
    assert '<td class="fail">1.23</td>' in render_html(eval_result)


def test_strings_are_escaped(eval_result):
    eval_result["rows"][0]["candidate"] = "<script>alert(1)</script>"
    page = render_html(eval_result)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_write_is_atomic_and_never_overwrites(eval_result, tmp_path):
    out = write_html_report(eval_result, tmp_path / "report.html")
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    with pytest.raises(FileExistsError, match="report.html"):
        write_html_report(eval_result, out)
    write_html_report(eval_result, out, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temporary file left behind


def test_bad_input():
    with pytest.raises(TypeError, match="mapping"):
        render_html([1, 2])
    with pytest.raises(TypeError, match="rows"):
        render_html({"rows": {}})


def test_empty_result_still_renders():
    page = render_html({})
    assert "<h2>Decision</h2>" in page and "<img" not in page and "No gates recorded" in page


@pytest.mark.browser
def test_chromium_renders_a_non_blank_page(eval_result, tmp_path, chromium_screenshot):
    page = write_html_report(eval_result, tmp_path / "report.html")
    pixels = chromium_screenshot(page)  # [height, width, rgb] floats in [0, 1]
    assert pixels.shape[:2] == (2000, 1280)
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200, f"only {len(colours)} distinct colours: the page looks blank"
    assert (pixels < 0.9).any(axis=-1).mean() > 0.05  # a real share of the page is not white


def _section_headers(page: str, heading: str) -> list[str]:
    """The ``<th>`` texts of the first table after ``<h2>heading</h2>``."""
    section = page.split(f"<h2>{heading}</h2>", 1)[1].split("</table>", 1)[0]
    return re.findall(r"<th[^>]*>([^<]*)</th>", section)


def test_candidates_table_has_one_pair_of_axis_columns(eval_result):
    """KIVI records key_axis/value_axis and HQQ axis_key/axis_value (kvlab.eval.candidates); one pair of columns."""
    from kvlab.eval.candidates import Candidate

    described = [Candidate.parse(n).describe(128, 32, 64) for n in ("dynamic", "kivi-4", "hqq-4")]
    kivi, hqq = described[1], described[2]
    assert {"key_axis", "value_axis"} <= set(kivi) and {"axis_key", "axis_value"} <= set(hqq)
    eval_result["candidates"] = [d | {"available": True, "skip_reason": None} for d in described]
    page = render_html(eval_result)
    headers = _section_headers(page, "Candidates")
    assert headers.count("key_axis") == 1 and headers.count("value_axis") == 1, headers
    assert "axis_key" not in headers and "axis_value" not in headers, headers
    col = headers.index("key_axis")
    section = page.split("<h2>Candidates</h2>", 1)[1].split("</table>", 1)[0]
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", tr) for tr in section.split("<tr>")[2:]]
    by_name = {cells[headers.index("name")]: cells for cells in rows}
    assert by_name["kivi-4"][col] == kivi["key_axis"]
    assert by_name["hqq-4"][col] == f"axis_key={hqq['axis_key']}"
    assert by_name["hqq-4"][headers.index("value_axis")] == f"axis_value={hqq['axis_value']}"
    assert by_name["dynamic"][col] == "-"


def test_html_numbers_share_one_format_and_verdicts_do_not_break():
    from kvlab.report_html import _fmt, _rows_table

    assert _fmt(16750.4) == "16,750" and _fmt(2166.0) == "2,166" and _fmt(12.3456) == "12.35"
    assert _fmt(2.5e6) == "2,500,000" and _fmt(1e-5) == "1e-05"
    rows = [
        {"matrix": "capacity", "candidate": "dynamic", "context_length": 512, "median_ms": 16750.4},
        {
            "matrix": "capacity",
            "candidate": "kivi-4",
            "context_length": 512,
            "median_ms": 2166.0,
            "eligible": True,
        },
    ]
    page = _rows_table(rows, {})
    assert "e+0" not in page
    assert 'class="key verdict">baseline<' in page and 'class="key pass verdict">eligible<' in page


def test_the_header_command_runs_as_printed(eval_result):
    """The header joined the recorded argv with spaces: an empty value vanished (`--window-residuals  --label x`,
    which the CLI reads as a missing value) and a value with spaces split. It is shell-quoted now, with the kept
    records' ``--window-residuals ''`` in today's spelling and a note; the raw data keeps the argv as it ran."""
    import html
    import shlex

    from kvlab.cli import build_parser

    result = dict(eval_result, command=["kvlab", "eval", "--window-residuals", "", "--label", "a b", "--quick"])
    page = render_html(result)
    shown = re.search(r"<td class=\"key\">command</td><td class=\"key\">(kvlab eval [^<]*)</td>", page)
    assert shown, page[:2000]
    text = html.unescape(shown.group(1))
    command, _, note = text.partition(" (")
    assert shlex.split(command) == ["kvlab", "eval", "--window-residuals", "none", "--label", "a b", "--quick"]
    assert note == "the result records `--window-residuals ''`; `none` is the current spelling)"
    build_parser().parse_args(shlex.split(command)[1:])  # exits 2 on a value the CLI refuses
