"""The TF trace's wall-clock times mapped onto the record's monotonic clock (tf_trace.ClockMap)."""
import pytest

from gpufeed.measure.inside.tf_trace import ClockMap


def test_one_reading_is_a_constant_offset():
    clock = ClockMap(unix_a=1000.0, offset_a=900.0)
    assert clock.to_clock(1010.0) == pytest.approx(110.0)


def test_drift_between_two_readings_is_interpolated():
    # the wall clock gained 2 ms over 10 s (NTP slewing): a time halfway is mapped with 1 ms of it
    clock = ClockMap(unix_a=1000.0, offset_a=900.0, unix_b=1010.0, offset_b=900.002)
    assert clock.to_clock(1005.0) == pytest.approx(105.0 - 0.001, abs=1e-9)
    assert clock.to_clock(1010.0) == pytest.approx(110.0 - 0.002, abs=1e-9)


def test_outside_the_readings_the_nearer_offset_holds():
    clock = ClockMap(unix_a=1000.0, offset_a=900.0, unix_b=1010.0, offset_b=900.002)
    assert clock.to_clock(990.0) == pytest.approx(90.0, abs=1e-9)
    assert clock.to_clock(1020.0) == pytest.approx(120.0 - 0.002, abs=1e-9)
