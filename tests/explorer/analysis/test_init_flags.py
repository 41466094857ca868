"""init_flags: every flag's severity, a tensor's severity, the totals a header shows, the time estimate."""

from __future__ import annotations

import pandas as pd

from explorer.analysis.init_flags import (
    FLAGS,
    SEVERITY,
    FlagTotal,
    flag_totals,
    format_seconds,
    severity_of,
    write_seconds_per_byte,
)


def test_only_overwritten_is_waste_every_other_flag_is_a_defect():
    assert set(SEVERITY) == set(FLAGS)
    assert [flag for flag in FLAGS if SEVERITY[flag] == "waste"] == ["overwritten"]


def test_a_tensor_is_as_severe_as_its_worst_flag():
    assert severity_of([]) is None
    assert severity_of(["overwritten"]) == "waste"
    assert severity_of(["overwritten", "outlier"]) == "defect"
    assert severity_of(["reinit differs"]) == "defect"


def test_totals_list_defects_first_and_sum_the_waste_of_its_carriers():
    report = pd.DataFrame(
        {
            "flags": [["overwritten"], ["uninitialized"], ["overwritten", "outlier"], []],
            "wasted_bytes": [100, 0, 28, 0],
            "wasted_s": [1.0, 0.0, 0.25, 0.0],
        }
    )
    assert flag_totals(report) == [
        FlagTotal("uninitialized", "defect", 1, 0, 0.0),
        FlagTotal("outlier", "defect", 1, 0, 0.0),
        FlagTotal("overwritten", "waste", 2, 128, 1.25),
    ]


def test_estimated_durations_keep_one_decimal_in_a_readable_unit():
    assert [format_seconds(seconds) for seconds in (0.43, 12.0, 0.0021, 0.0000031, 5.6e-8, 0.0)] == [
        "~0.4 s", "~12.0 s", "~2.1 ms", "~3.1 µs", "~56.0 ns", "0 s"]


def test_the_write_cost_is_measured_once_per_process():
    first = write_seconds_per_byte()
    assert 0 < first < 1e-6  # a byte takes far less than a microsecond to draw
    assert write_seconds_per_byte() is first
