"""The pages' formatting filters and query parsing (unit tests, no broker)."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from txmq.console._pages import (
    fmt_bytes,
    fmt_duration,
    fmt_num,
    fmt_perm,
    fmt_time,
    int_param,
    iso_input,
    plotly_js_path,
    time_param,
)
from txmq.errors import InvalidRequest


def _request(query: str) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "query_string": query.encode(),
                    "headers": []})


@pytest.mark.parametrize(("ms", "text"), [(None, "-"), (-1, "-"), (0, "0 ms"), (999, "999 ms"),
                                          (1_000, "1 s"), (93_000, "1 min 33 s"),
                                          (3_600_000, "1 h"), (90_061_000, "1 d 1 h")])
def test_durations_show_the_two_largest_units(ms: int | None, text: str) -> None:
    assert fmt_duration(ms) == text


def test_numbers_bytes_perm_and_times() -> None:
    assert (fmt_num(1234567), fmt_num(1.25, 1), fmt_num(None)) == ("1,234,567", "1.2", "-")
    assert [fmt_bytes(n) for n in (0, 1023, 1536, 5 * 2**30)] == ["0 B", "1023 B", "1.5 KiB", "5.0 GiB"]
    assert [fmt_perm(p) for p in (6, 4, 7, 0)] == ["rw-", "r--", "rwx", "---"]
    assert fmt_time(0) == "-" and fmt_time(1_795_420_800_000) == "2026-11-23 08:00:00"
    assert iso_input(1_795_420_800_000) == "2026-11-23T08:00:00" and iso_input(0) == ""


def test_int_param_default_range_and_reasons() -> None:
    assert int_param(_request(""), "page", 3, 0, 10) == 3
    assert int_param(_request("page=7"), "page", 0, 0, 10) == 7
    for query, reason in (("page=x", "not a whole number"), ("page=11", "not in 0..10")):
        with pytest.raises(InvalidRequest, match=reason):
            int_param(_request(query), "page", 0, 0, 10)


def test_time_param_reads_ms_or_iso_as_utc() -> None:
    assert time_param(_request(""), "begin") == 0
    assert time_param(_request("begin_ms=5"), "begin") == 5
    assert time_param(_request("begin=2026-11-23T08:00"), "begin") == 1_795_420_800_000
    assert time_param(_request("begin=2026-11-23T09:00%2B01:00"), "begin") == 1_795_420_800_000
    with pytest.raises(InvalidRequest, match="ISO 8601"):
        time_param(_request("begin=yesterday"), "begin")


def test_plotly_js_comes_from_the_installed_package() -> None:
    path = plotly_js_path()
    assert path.name == "plotly.min.js" and path.parent.name == "package_data"
    assert path.stat().st_size > 1_000_000
