"""The one table renderer: the report, the bench scripts and the end-of-run summary all use it.

`render(columns, rows, fmt)` with `fmt` one of
  - "markdown": a GitHub table, one space around each cell (`|` in a cell is escaped),
  - "text": columns padded to their widest cell, for the console,
  - "latex": a booktabs `tabular` (special characters escaped; needs \\usepackage{booktabs}).

A column is a `Column` or just its title. A row is a list (cells in column order; a shorter row
leaves the last cells out) or a dict (cells by `Column.key`, which defaults to the title). A
cell is shown as is when it is a string, as "-" when it is None, else as
`format(cell, column.spec)`. Alignment: the first column left, the others right, unless the
column says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MISSING = "-"


@dataclass(frozen=True)
class Column:
    title: str
    key: str | None = None  # a dict row's key for this column (default: the title)
    spec: str = ""  # format spec for cells that are not strings, e.g. ".2f"
    align: str | None = None  # "<" left, ">" right; None: left for the first column, right for the others


def cell(value, spec: str = "") -> str:
    if value is None:
        return MISSING
    if isinstance(value, str):
        return value
    return format(value, spec)


def _columns(columns: Sequence[Column | str]) -> list[Column]:
    out = []
    for i, c in enumerate(columns):
        c = c if isinstance(c, Column) else Column(str(c))
        align = c.align or ("<" if i == 0 else ">")
        if align not in ("<", ">"):
            raise ValueError(f"column {c.title!r}: align must be '<' or '>', not {align!r}")
        out.append(Column(c.title, c.key if c.key is not None else c.title, c.spec, align))
    return out


def _cells(columns: list[Column], rows) -> list[list[str]]:
    out = []
    for row in rows:
        if isinstance(row, Mapping):
            values = [row.get(c.key) for c in columns]
        else:
            values = list(row)
            if len(values) > len(columns):
                raise ValueError(f"a row has {len(values)} cells for {len(columns)} columns: {values}")
        out.append([cell(v, c.spec) for v, c in zip(values, columns)])
    return out


def md_escape(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
        "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "×": r"$\times$"}


def tex_escape(s) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(s))


def markdown(columns: Sequence[Column | str], rows) -> str:
    cols = _columns(columns)

    def line(cells):
        return "| " + " | ".join(md_escape(c) for c in cells) + " |"

    rule = "|" + "|".join("---" if c.align == "<" else "---:" for c in cols) + "|"
    return "\n".join([line(c.title for c in cols), rule, *(line(r) for r in _cells(cols, rows))])


def text(columns: Sequence[Column | str], rows, indent: str = "", gap: int = 2, header: bool = True) -> str:
    cols = _columns(columns)
    body = ([[c.title for c in cols]] if header else []) + _cells(cols, rows)
    if not body:
        return ""
    widths = [max(len(r[i]) for r in body if i < len(r)) for i in range(len(cols))]

    def line(cells):
        padded = [format(v, f"{c.align}{w}") for v, c, w in zip(cells, cols, widths)]
        return (indent + (" " * gap).join(padded)).rstrip()

    return "\n".join(line(r) for r in body)


def latex(columns: Sequence[Column | str], rows) -> str:
    cols = _columns(columns)

    def line(cells):
        return " & ".join(tex_escape(c) for c in cells) + " \\\\"

    spec = "".join("l" if c.align == "<" else "r" for c in cols)
    return "\n".join([f"\\begin{{tabular}}{{{spec}}}", "\\toprule", line(c.title for c in cols), "\\midrule",
                      *(line(r) for r in _cells(cols, rows)), "\\bottomrule", "\\end{tabular}"])


FORMATS = {"markdown": markdown, "text": text, "latex": latex}


def render(columns: Sequence[Column | str], rows, fmt: str = "markdown") -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown table format {fmt!r}; allowed: {', '.join(FORMATS)}")
    return FORMATS[fmt](columns, rows)
