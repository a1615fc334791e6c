"""The ``/* dp: accuracy=... confidence=... */`` comment hint and its precedence."""

from __future__ import annotations

import pytest

from proxy.errors import DpproxyError
from sqlmap.accuracy import AccuracyDefaults, AccuracyRequest
from sqlmap.cube import CategoricalDimension, Cube
from sqlmap.postprocess import split
from sqlmap.translate import Translator

CUBE = Cube("public", "adult", (CategoricalDimension("sex", ("Male", "Female")),))
T = Translator([CUBE])
SESSION = AccuracyDefaults(7, 0.99)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("/* dp: accuracy=100 confidence=0.9 */ SELECT COUNT(*) FROM adult", (100, 0.9)),
        ("SELECT COUNT(*) -- dp: accuracy=5\nFROM adult", (5, 0.99)),
        ("SELECT COUNT(*) FROM adult /* DP: confidence = .8 */", (7, 0.8)),
        ("SELECT COUNT(*) /* dp: accuracy=5, confidence=0.8 */ FROM adult", (5, 0.8)),
        # the clause comes first, the hint fills in what it lacks, then the session
        (
            "SELECT COUNT(*) /* dp: accuracy=5 confidence=0.8 */ FROM adult WITH ACCURACY 3",
            (3, 0.8),
        ),
        (
            "SELECT COUNT(*) /* dp: accuracy=5 */ FROM adult WITH ACCURACY 3 CONFIDENCE 0.7",
            (3, 0.7),
        ),
        ("SELECT COUNT(*) /* not a hint: accuracy=5 */ FROM adult", (7, 0.99)),
        ('SELECT COUNT(*) AS "/* dp: accuracy=5 */" FROM adult', (7, 0.99)),
    ],
)
def test_hint_precedence(sql: str, expected: tuple[float, float]) -> None:
    assert T.translate(sql, SESSION).accuracy == AccuracyRequest(*expected)


def test_hint_reaches_the_cores_of_a_wrapped_statement() -> None:
    tree = T.parse(
        "SELECT sex, COUNT(*) FROM adult GROUP BY sex ORDER BY 2 DESC LIMIT 1001 "
        "/* dp: accuracy=50 */"
    )
    wrapped = split(tree, T)
    assert wrapped is not None
    spec = T.translate_parsed(wrapped.cores[0].select, SESSION)
    assert spec.accuracy == AccuracyRequest(50, 0.99)


@pytest.mark.parametrize(
    ("sql", "sqlstate", "words"),
    [
        (
            "SELECT COUNT(*) /* dp: accuracy=5 */ FROM adult /* dp: accuracy=6 */",
            "42601",
            "only one",
        ),
        ("SELECT COUNT(*) /* dp: acuracy=5 */ FROM adult", "42601", "unreadable dp hint"),
        ("SELECT COUNT(*) /* dp: accuracy=lots */ FROM adult", "42601", "needs a number"),
        ("SELECT COUNT(*) /* dp: accuracy=-1 */ FROM adult", "22023", "positive"),
        ("SELECT COUNT(*) /* dp: confidence=1.5 */ FROM adult", "22023", "between 0 and 1"),
    ],
)
def test_bad_hints_are_refused(sql: str, sqlstate: str, words: str) -> None:
    with pytest.raises(DpproxyError, match=words) as info:
        T.translate(sql, SESSION)
    assert info.value.sqlstate == sqlstate
