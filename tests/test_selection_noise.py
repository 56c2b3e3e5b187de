"""A selection that never crowns noise: ties by overlapping 95% intervals, costs with their +-,
and contended cells named in the decision."""

import math

import pytest

from kvsweep.report.html_page import render_page
from kvsweep.report.markdown import decision_rows, evidence_rows, short_form
from kvsweep.report.selection import Settings, decide
from kvsweep.report.table import results_table
from test_report import result


def timed(cache, tpot, low, high, memory, tags=None):
    return result(cache, tpot_ms=tpot, tpot_ms_ci_low=low, tpot_ms_ci_high=high, kv_cache_bytes=memory, tags=tags)


def test_overlapping_intervals_are_a_tie_broken_by_memory_then_simplicity():
    [decision] = decide(
        [
            timed("dynamic", 10.0, 9.5, 10.6, 1000.0),
            timed("static", 9.8, 9.0, 10.2, 1300.0),  # fastest median, but inside dynamic's interval
            timed("quantized-hqq-int4", 12.0, 11.5, 12.5, 300.0),  # clearly slower: not in the tie
        ],
        Settings(),
    )
    assert [e.label for e in decision.tied] == ["static", "dynamic"]
    assert decision.pick.label == "dynamic"  # less memory than static
    line = short_form([decision])
    assert "tied within noise" in line and "static, dynamic" in line and "pick dynamic" in line
    assert "fastest static" not in line


def test_equal_memory_goes_to_the_simpler_strategy():
    [decision] = decide(
        [timed("static", 9.9, 9.0, 11.0, 1000.0), timed("dynamic", 10.0, 9.2, 10.8, 1000.0)], Settings()
    )
    assert decision.tied and decision.pick.label == "dynamic"


def test_separate_intervals_name_the_fastest_with_the_uncertainty_of_its_cost():
    [decision] = decide([timed("dynamic", 10.0, 9.8, 10.2, 1000.0), timed("static", 8.0, 7.8, 8.2, 1300.0)], Settings())
    assert not decision.tied and decision.pick.label == "static"
    static = next(e for e in decision.entries if e.label == "static")
    # -20%; relative half-widths 2.5% and 2% in quadrature, times the ratio 0.8: +-2.56%.
    assert static.errors["TPOT"] == pytest.approx(0.8 * math.hypot(0.025, 0.02))
    assert "TPOT -20% ±3%" in short_form([decision])


def test_contended_deciding_cells_are_named_in_the_decision_the_table_and_the_report():
    contended = {"kvsweep.contended": "true", "kvsweep.contention": "host 0.51, steal 0.00"}
    results = [timed("dynamic", 10.0, 9.8, 10.2, 1000.0), timed("static", 8.0, 7.8, 8.2, 1300.0, contended)]
    [decision] = decide(results, Settings())
    line = short_form([decision])
    assert "CONTENDED deciding cells: static (host 0.51, steal 0.00)" in line
    table = results_table(results)
    static_row = next(row for row in table.splitlines() if " static " in row)
    assert "ok*" in static_row
    assert "other processes took the cell's CPUs" in table
    page = render_page("sweep", "", [decision], [], {}, "")
    assert "CONTENDED (host 0.51" in page


def test_a_clean_group_says_nothing_about_contention():
    [decision] = decide([timed("dynamic", 10.0, 9.8, 10.2, 1000.0)], Settings())
    assert "CONTENDED" not in short_form([decision])


def test_the_decision_table_calls_a_tie_broken_pick_a_pick_not_the_fastest():
    tie = [timed("dynamic", 10.0, 9.5, 10.6, 1000.0), timed("static", 9.8, 9.0, 10.2, 1300.0)]
    clear = [timed("dynamic", 10.0, 9.8, 10.2, 1000.0), timed("static", 8.0, 7.8, 8.2, 1300.0)]
    for results, pick, why in [(tie, "dynamic", "tied within noise: static, dynamic"), (clear, "static", "fastest")]:
        decisions = decide(results, Settings())
        header, [row] = decision_rows(decisions, {})
        assert "fastest" not in header and "pick by tpot_ms" in header
        assert row[header.index("pick by tpot_ms")].startswith(f"{pick} ({why}")
        _, evidence = evidence_rows(decisions, {})
        notes = {row[2]: row[-1] for row in evidence}
        assert notes[pick].startswith("**pick of the tied**" if results is tie else "**fastest**")
    assert "fastest" not in decision_rows(decide(tie, Settings()), {})[1][0][5]  # static was faster: not named so
