"""How values read as text in the widget's cells: durations and byte shortfalls."""

import pytest

from widgets.formatting import bytes_text, seconds_text


@pytest.mark.parametrize("value, text", [(0, "0 s"), (4.6e-6, "4.6 µs"), (0.0125, "12.5 ms"), (3.2, "3.2 s"),
                                         (8.5e-7, "850 ns"), (None, "")])
def test_seconds_read_in_the_unit_that_keeps_them_short(value, text):
    assert seconds_text(value) == text


@pytest.mark.parametrize("value, text", [(1536, "1.5 KiB"), (-1536, "-1.5 KiB"), (-48, "-48 B"), (None, "")])
def test_a_byte_shortfall_reads_with_a_minus(value, text):
    assert bytes_text(value) == text
