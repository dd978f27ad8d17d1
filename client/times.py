"""Reading the API's ISO-8601 timestamps, for the CLI and the reviewer UI alike."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_time(text: str | None) -> datetime | None:
    """An aware datetime from an API timestamp (``…Z`` or with an offset; none means UTC), or None if unreadable."""
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def age_seconds(text: str | None, now: datetime | None = None) -> float | None:
    """Seconds since the timestamp ``text`` (never negative), or None if it is unreadable."""
    when = parse_time(text)
    if when is None:
        return None
    return max(0.0, ((now or datetime.now(UTC)) - when).total_seconds())
