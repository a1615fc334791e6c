"""The session's ``dp.*`` settings: accuracy defaults, and how much the notices say.

Accuracy defaults serve tools that cannot add a clause. ``SET dp.accuracy = 10``,
``SET dp.confidence TO 0.9``, ``SET dp.notices = rows``, ``SET dp.estimate = unbiased``,
``RESET dp.accuracy``,
``SHOW dp.accuracy`` and the startup option ``-c dp.accuracy=10`` are handled by the proxy,
never by PostgreSQL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from proxy.errors import InvalidParameterValue, UnknownSetting
from sqlmap.accuracy import AccuracyDefaults

__all__ = [
    "DpSettings",
    "ESTIMATES",
    "NOTICE_LEVELS",
    "SETTING_NAMES",
    "SettingCommand",
    "Verb",
]

#: The settings a session may change.
SETTING_NAMES = ("dp.accuracy", "dp.confidence", "dp.notices", "dp.estimate")

#: What ``dp.notices`` may say: one NOTICE per statement, or one per answered value.
NOTICE_LEVELS = ("summary", "rows")

#: What ``dp.estimate`` returns: the estimate in the values the true answer can take (the
#: posterior mode, with the interval cut to that range), or the raw unbiased estimate.
ESTIMATES = ("range", "unbiased")


class Verb(Enum):
    """What a setting command does; the value is its CommandComplete tag."""

    SET = "SET"
    RESET = "RESET"
    SHOW = "SHOW"


@dataclass(frozen=True, slots=True)
class SettingCommand:
    """One ``SET``, ``RESET`` or ``SHOW`` of a ``dp.*`` setting, as the router read it.

    ``value`` is the text a SET gives (None for ``SET ... TO DEFAULT``, RESET and SHOW).
    """

    verb: Verb
    name: str
    value: str | None = None


@dataclass(frozen=True, slots=True)
class DpSettings:
    """A session's own values; None means "use the config default".

    >>> s = DpSettings().set("dp.accuracy", "10").set("dp.confidence", "0.9")
    >>> s.defaults(AccuracyDefaults(None, 0.95))
    AccuracyDefaults(accuracy=10.0, confidence=0.9)
    """

    accuracy: float | None = None
    confidence: float | None = None
    notices: str | None = None
    estimate: str | None = None

    @property
    def notices_per_row(self) -> bool:
        """``SET dp.notices = rows``: a NOTICE per answered value instead of one per statement."""
        return self.notices == "rows"

    @property
    def unbiased(self) -> bool:
        """``SET dp.estimate = unbiased``: raw unbiased estimates, symmetric intervals."""
        return self.estimate == "unbiased"

    def set(self, name: str, value: str | None, start: DpSettings | None = None) -> DpSettings:
        """A copy with ``name`` set to ``value``.

        None (``RESET``, ``SET ... TO DEFAULT``) goes back to the value the session started
        with (``start``, from the startup packet's options), as PostgreSQL's RESET does.

        >>> start = DpSettings(accuracy=77.0)
        >>> DpSettings(accuracy=5.0).set("dp.accuracy", None, start).accuracy
        77.0
        """
        field = _field(name)
        if value is None:
            return replace(self, **{field: getattr(start, field) if start else None})
        text = value.strip().strip("'\"")
        choices = {"notices": NOTICE_LEVELS, "estimate": ESTIMATES}.get(field)
        if choices is not None:
            choice = text.lower()
            if choice not in choices:
                raise InvalidParameterValue(
                    f'invalid value for parameter "{name}": "{value}"',
                    hint=f"{name} is {' or '.join(choices)}",
                )
            return (
                replace(self, notices=choice)
                if field == "notices"
                else replace(self, estimate=choice)
            )
        try:
            number = float(text)
        except ValueError:
            raise InvalidParameterValue(
                f'invalid value for parameter "{name}": "{value}"'
            ) from None
        if field == "accuracy" and not (math.isfinite(number) and number > 0):
            raise InvalidParameterValue(
                f'invalid value for parameter "{name}": "{value}"',
                hint="dp.accuracy must be a positive number",
            )
        if field == "confidence" and not 0 < number < 1:
            raise InvalidParameterValue(
                f'invalid value for parameter "{name}": "{value}"',
                hint="dp.confidence must lie strictly between 0 and 1",
            )
        if field == "accuracy":
            return replace(self, accuracy=number)
        return replace(self, confidence=number)

    def show(self, name: str, defaults: AccuracyDefaults) -> str:
        """What ``SHOW name`` prints: the session's value, else the default in force."""
        field = _field(name)
        if field == "notices":
            return self.notices or NOTICE_LEVELS[0]
        if field == "estimate":
            return self.estimate or ESTIMATES[0]
        effective = self.defaults(defaults)
        value = effective.accuracy if field == "accuracy" else effective.confidence
        return "" if value is None else f"{value:g}"

    def defaults(self, base: AccuracyDefaults) -> AccuracyDefaults:
        """``base`` (from config.yaml) overridden by this session's values."""
        return AccuracyDefaults(
            self.accuracy if self.accuracy is not None else base.accuracy,
            self.confidence if self.confidence is not None else base.confidence,
        )

    @classmethod
    def from_options(cls, args: list[str]) -> tuple[DpSettings, list[str]]:
        """Take ``-c dp.x=v`` / ``--dp.x=v`` out of startup ``options`` arguments.

        Returns the settings and the arguments left for PostgreSQL.

        >>> DpSettings.from_options(["-c", "dp.accuracy=5", "-cgeqo=off"])
        (DpSettings(accuracy=5.0, confidence=None, notices=None, estimate=None), ['-cgeqo=off'])
        """
        settings, rest, i = cls(), [], 0
        while i < len(args):
            arg = args[i]
            assignment: str | None = None
            if arg == "-c" and i + 1 < len(args):
                assignment, consumed = args[i + 1], 2
            elif arg.startswith("-c"):
                assignment, consumed = arg[2:], 1
            elif arg.startswith("--"):
                assignment, consumed = arg[2:], 1
            else:
                consumed = 1
            name, _, value = (assignment or "").partition("=")
            if name.strip().lower().startswith("dp."):
                settings = settings.set(name.strip().lower(), value)
            else:
                rest.extend(args[i : i + consumed])
            i += consumed
        return settings, rest


def _field(name: str) -> str:
    if name not in SETTING_NAMES:
        raise UnknownSetting(
            f'unrecognized configuration parameter "{name}"',
            hint=f"dpproxy's settings are {', '.join(SETTING_NAMES)}",
        )
    return name.removeprefix("dp.")
