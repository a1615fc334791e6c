"""DP answers and dp.* settings as protocol messages: row descriptions, data rows, notices."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxy.dp.answering import DpResult, ResultColumn
from proxy.wire import DataRow, NoticeResponse, RowDescription
from proxy.wire.types import Oid, column, encode_value

__all__ = [
    "row_description",
    "data_rows",
    "notices",
    "Formats",
    "TEXT_ONLY",
]

#: The result format (0 text, 1 binary) of column i of n: a Bind's `result_format`.
Formats = Callable[[int, int], int]


def TEXT_ONLY(index: int, columns: int) -> int:  # noqa: N802 - a constant-like function
    """Every column in text, as the simple query protocol sends them.

    >>> TEXT_ONLY(0, 3)
    0
    """
    return 0


def row_description(
    columns: Sequence[ResultColumn], formats: Formats = TEXT_ONLY
) -> RowDescription:
    """The RowDescription of DP result columns in the formats asked for.

    >>> row_description([ResultColumn("n", 701)]).fields[0].type_size
    8
    """
    n = len(columns)
    return RowDescription(
        tuple(column(c.name, c.type_oid, formats(i, n)) for i, c in enumerate(columns))
    )


def data_rows(
    result: DpResult, formats: Formats = TEXT_ONLY, start: int = 0, stop: int | None = None
) -> list[DataRow]:
    r"""The DataRows of ``result.rows[start:stop]``, each value in its column's format.

    >>> from proxy.dp.answering import DpResult
    >>> r = DpResult((ResultColumn("sex", 25), ResultColumn("n", 701)), (("Male", 2.5),), (), ())
    >>> data_rows(r)[0].values, data_rows(r, lambda i, n: 1)[0].values[1]
    ((b'Male', b'2.5'), b'@\x04\x00\x00\x00\x00\x00\x00')
    """
    n = len(result.columns)
    codes = [formats(i, n) for i in range(n)]
    oids = [c.type_oid for c in result.columns]
    rows = []
    for row in result.rows[start:stop]:
        rows.append(DataRow(tuple(_encode(v, oids[i], codes[i]) for i, v in enumerate(row))))
    return rows


def _encode(value: str | float | None, oid: int, code: int) -> bytes | None:
    if value is not None and oid == Oid.FLOAT8 and not isinstance(value, float):
        value = float(value)
    return encode_value(value, oid, code)


def notices(result: DpResult, per_row: bool = False) -> list[NoticeResponse]:
    """The NOTICEs of an answer: its warnings, then one line for the statement.

    A single value's line gives its estimate, interval, confidence, source and budget; several
    values get one summary (sources and budget), or with ``per_row`` (``SET dp.notices =
    rows``) a line each.
    """
    lines = result.notices if per_row or len(result.notices) <= 1 else (result.summary,)
    return [
        NoticeResponse({"S": "NOTICE", "V": "NOTICE", "C": "00000", "M": text})
        for text in (*result.warnings, *lines)
    ]
