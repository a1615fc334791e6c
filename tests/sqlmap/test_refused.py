"""Every query dpproxy cannot answer exactly is refused with a specific message and SQLSTATE."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import load_config
from proxy.errors import DpproxyError

from .corpus import Case, read_corpus

TRANSLATOR = load_config(Path(__file__).parent.parent.parent / "config.yaml").translator()
CASES = read_corpus("refused.sql")


def test_corpus_has_expectations() -> None:
    assert len(CASES) >= 50
    assert all(c.sqlstate and c.message for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused(case: Case) -> None:
    with pytest.raises(DpproxyError) as raised:
        TRANSLATOR.translate(case.sql)
    error = raised.value
    assert error.sqlstate == case.sqlstate, f"{error!r}"
    assert case.message is not None and case.message in str(error), str(error)


def test_error_points_at_the_offending_token() -> None:
    sql = "SELECT COUNT(*) FROM adult WHERE sex = 'M' AND age < 30"
    with pytest.raises(DpproxyError) as raised:
        TRANSLATOR.translate(sql)
    assert raised.value.position == sql.index("30")


def test_undeclared_column_position() -> None:
    sql = "SELECT COUNT(*) FROM adult WHERE fnlwgt > 1"
    with pytest.raises(DpproxyError) as raised:
        TRANSLATOR.translate(sql)
    assert raised.value.position == sql.index("fnlwgt")
