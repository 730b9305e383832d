"""The console's notices: after an action the page is reloaded with `?notice=<key>` (and
the key's parameters), and shows that key's message from this fixed set. Nothing a link
carries is shown as text: an unknown key shows nothing, and each parameter must be one of
the values its message allows (a count, a job type, a sweep name, an error code)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Literal
from urllib.parse import urlencode

from san_api.errors import AppError
from san_common.jobs.types import JobType
from san_common.models.operations import SWEEP_NAMES

# The keys, as a type: `console._back` takes only these, so mypy refuses a page that would
# put text in the link instead.
NoticeKey = Literal[
    "retried",
    "cancelled",
    "paused",
    "resumed",
    "bulk-retry",
    "bulk-cancel",
    "redriven",
    "purged",
    "sweeps-requested",
    "invalid",
    "refused",
]

MESSAGES: dict[NoticeKey, str] = {
    "retried": "retry registered: same job id, a new try",
    "cancelled": "cancelled",
    "paused": "{type} paused",
    "resumed": "{type} resumed",
    "bulk-retry": "retry: {count} job(s)",
    "bulk-cancel": "cancel: {count} job(s)",
    "redriven": "{count} re-driven, {unredrivable} not re-drivable, {failed} failed",
    "purged": "{count} dead letter(s) purged",
    "sweeps-requested": "requested: {sweeps}",
    "invalid": "the form was not valid; check its fields",
    "refused": "refused: {code}",
}


_BY_NAME: dict[str, str] = {str(key): text for key, text in MESSAGES.items()}


def _subclasses(cls: type[AppError]) -> Iterator[type[AppError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _count(value: str) -> str | None:
    return value if value.isdigit() and len(value) <= 9 else None


def _job_type(value: str) -> str | None:
    return value if value in {t.value for t in JobType} else None


def _sweeps(value: str) -> str | None:
    names = value.split(",")
    return ", ".join(names) if names and all(n in SWEEP_NAMES for n in names) else None


def _code(value: str) -> str | None:
    titles = {e.code: e.title for e in _subclasses(AppError)}
    return f"{titles[value]} ({value})" if value in titles else None


PARAMETERS: dict[str, Callable[[str], str | None]] = {
    "count": _count,
    "unredrivable": _count,
    "failed": _count,
    "type": _job_type,
    "sweeps": _sweeps,
    "code": _code,
}


def query(key: NoticeKey, *, error: bool = False, **params: object) -> str:
    """The query string that makes the next page show `key`'s message."""
    pairs = {"notice": key, **{k: str(v) for k, v in params.items()}}
    return urlencode({**pairs, **({"error": "1"} if error else {})})


def message(params: Mapping[str, str]) -> str | None:
    """The notice a page's query asks for, or None when it names none we know."""
    template = _BY_NAME.get(params.get("notice", ""))
    if template is None:
        return None
    values: dict[str, str] = {}
    for name, check in PARAMETERS.items():
        if "{" + name + "}" in template:
            checked = check(params.get(name, ""))
            if checked is None:
                return None
            values[name] = checked
    return template.format(**values)
