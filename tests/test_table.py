"""specbench.core.table, the one renderer behind the report, the bench scripts and the run summary."""

import pytest

from specbench.report.tables import LATEX, MARKDOWN, Table, render
from specbench.core.table import Column, cell, latex, markdown, text

COLS = ["method", Column("tok/s", "tps", ".2f"), Column("note", align="<")]
ROWS = [{"method": "pld", "tps": 123.456, "note": "a|b"}, ["vanilla_sd", None, "x"]]


def test_markdown_escapes_pipes_formats_cells_and_marks_alignment():
    lines = markdown(COLS, ROWS).splitlines()
    assert lines == [
        "| method | tok/s | note |",
        "|---|---:|---|",
        "| pld | 123.46 | a\\|b |",  # a `|` in a cell would split it into two columns
        "| vanilla_sd | - | x |",  # None -> "-"
    ]
    assert markdown(["a|b"], []).splitlines()[0] == "| a\\|b |"
    assert "\n" not in markdown(["a"], [["two\nlines"]]).splitlines()[2]


def test_every_markdown_row_has_as_many_cells_as_the_header():
    nasty = [["|", "||", "a | b"], {"method": "x|y"}]
    for line in markdown(COLS, nasty).splitlines():
        unescaped = line.replace("\\|", "")
        assert unescaped.count("|") == len(COLS) + 1, line


def test_text_columns_line_up():
    out = text(COLS, ROWS + [["a-much-longer-name", 1.0, "z"]], indent="  ")
    lines = out.splitlines()
    assert all(line.startswith("  ") for line in lines)
    # a right-aligned column ends, a left-aligned one starts, at the same offset on every line
    ends = {line.index(v) + len(v) for line, v in zip(lines, ["tok/s", "123.46", "-", "1.00"])}
    assert len(ends) == 1
    note_at = {lines[0].index("note"), lines[1].index("a|b"), lines[2].index("x"), lines[3].index("z")}
    assert len(note_at) == 1
    assert lines[2].split() == ["vanilla_sd", "-", "x"]
    assert all(line == line.rstrip() for line in lines)  # no trailing blanks from the last column


def test_empty_rows_give_the_header_alone():
    assert markdown(COLS, []).splitlines() == ["| method | tok/s | note |", "|---|---:|---|"]
    assert text(COLS, []).split() == ["method", "tok/s", "note"]
    assert text(COLS, [], header=False) == ""
    assert text(COLS, [["a", 1.0, "b"], ["ccc", 22.0, "d"]], header=False).splitlines() == ["a     1.00  b", "ccc  22.00  d"]
    assert latex(COLS, []).splitlines()[1:-1] == ["\\toprule", "method & tok/s & note \\\\", "\\midrule", "\\bottomrule"]


def test_latex_escapes_and_aligns():
    out = latex(COLS, [["a_b & 50%", 2.0, "±"]])
    assert out.startswith("\\begin{tabular}{lrl}")
    assert "a\\_b \\& 50\\% & 2.00 & $\\pm$ \\\\" in out


def test_cells_rows_and_columns():
    assert cell(None) == "-" and cell("0.5", ".2f") == "0.5" and cell(0.5, ".2f") == "0.50" and cell(3) == "3"
    assert markdown(["a", "b", "c"], [["only"]]).splitlines()[2] == "| only |"  # a short row (e.g. a failure note)
    with pytest.raises(ValueError, match="3 cells for 2 columns"):
        markdown(["a", "b"], [[1, 2, 3]])
    with pytest.raises(ValueError, match="align"):
        markdown([Column("a", align="^")], [])


def test_report_documents_use_the_renderer():
    t = Table("T", ["Method", "x"], [["pld", "1|2"]], "note")
    md, tex = render([t], [], MARKDOWN), render([t], [], LATEX)
    assert markdown(t.header, t.rows) in md and "| pld | 1\\|2 |" in md
    assert latex(t.header, t.rows) in tex and "\\caption{T. note}" in tex
