"""CSV that a spreadsheet opens as data: no cell of ours is ever read as a formula (CSV injection).

OWASP's rule: a text cell beginning with = + - @ TAB or CR gets a leading single quote, which Excel, LibreOffice
and Google Sheets show as text; numbers are left as they are (a negative number is a number, not a formula). The
full-width forms of = + - @ count too: Excel in East Asian locales reads a cell typed with them as a formula.
Light on purpose (standard library only): tools/predict.py and runner/sweep/summary.py write their CSV with it.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")  # then ＝ ＋ － ＠


def safe_cell(value: Any) -> Any:
    """`value`, with a leading ' when it is text a spreadsheet would read as a formula."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_text(rows: Iterable[Sequence[Any]]) -> str:
    """The rows (a header first) as CSV text, "\\n" line ends, every text cell made safe."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerows([safe_cell(v) for v in row] for row in rows)
    return buffer.getvalue()
