"""Spreadsheet-safe CSV cells."""
from runner.csvsafe import csv_text, safe_cell


def test_full_width_formula_signs_are_quoted_too():
    """＝ ＋ － ＠ at a cell's start are what an East Asian Excel reads as = + - @; inside a cell they are text."""
    assert [safe_cell(v) for v in ("\uff1dHYPERLINK(1)", "\uff0b1", "\uff0dcmd", "\uff20x", "a\uff1db")] == [
        "'\uff1dHYPERLINK(1)", "'\uff0b1", "'\uff0dcmd", "'\uff20x", "a\uff1db"]
    assert csv_text([["name"], ["\uff1d1+1"]]) == "name\n'\uff1d1+1\n"
