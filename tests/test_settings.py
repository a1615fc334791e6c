"""Session dp.* settings: SET, RESET, SHOW and startup options."""

from __future__ import annotations

import pytest

from proxy.dp.settings import DpSettings
from proxy.errors import DpproxyError
from sqlmap.accuracy import AccuracyDefaults

CONFIG = AccuracyDefaults(100, 0.95)


def test_set_show_reset() -> None:
    s = DpSettings()
    assert s.show("dp.accuracy", CONFIG) == "100"
    s = s.set("dp.accuracy", "'12.5'")
    assert s.show("dp.accuracy", CONFIG) == "12.5"
    assert s.defaults(CONFIG) == AccuracyDefaults(12.5, 0.95)
    assert s.set("dp.accuracy", None).show("dp.accuracy", CONFIG) == "100"
    assert DpSettings().show("dp.accuracy", AccuracyDefaults(None, 0.9)) == ""


@pytest.mark.parametrize(
    ("name", "value", "sqlstate", "message"),
    [
        ("dp.accuracy", "0", "22023", 'invalid value for parameter "dp.accuracy": "0"'),
        ("dp.accuracy", "ten", "22023", 'invalid value for parameter "dp.accuracy": "ten"'),
        ("dp.confidence", "1", "22023", "dp.confidence must lie strictly between 0 and 1"),
        ("dp.epsilon", "1", "42704", 'unrecognized configuration parameter "dp.epsilon"'),
    ],
)
def test_bad_settings(name: str, value: str, sqlstate: str, message: str) -> None:
    with pytest.raises(DpproxyError) as raised:
        DpSettings().set(name, value)
    assert raised.value.sqlstate == sqlstate and message in str(raised.value)


def test_startup_options_keep_other_arguments() -> None:
    settings, rest = DpSettings.from_options(
        ["-c", "dp.confidence=0.8", "--dp.accuracy=3", "-c", "search_path=x"]
    )
    assert settings == DpSettings(3.0, 0.8)
    assert rest == ["-c", "search_path=x"]


def test_estimate_setting() -> None:
    s = DpSettings()
    assert s.show("dp.estimate", CONFIG) == "range" and not s.unbiased
    s = s.set("dp.estimate", "'UNBIASED'")
    assert s.show("dp.estimate", CONFIG) == "unbiased" and s.unbiased
    assert not s.set("dp.estimate", None).unbiased  # RESET: back to the session's start
    start, _ = DpSettings.from_options(["-c", "dp.estimate=unbiased"])
    assert start.unbiased and DpSettings().set("dp.estimate", None, start).unbiased
    with pytest.raises(DpproxyError) as raised:
        s.set("dp.estimate", "mean")
    assert raised.value.sqlstate == "22023" and "dp.estimate is range or unbiased" in str(
        raised.value
    )
