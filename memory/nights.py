"""Which night a chat's nightly sleep is due for.

A night is named by the local date of its ``sleep_time``. It comes due at that time and stays due until
the next midnight, or :data:`LATE` after it when that is later: the checks run every ten minutes, so a
``sleep_time`` of "23:55" is often first seen at 00:03 the next day (when the clock reads "00:03" <
"23:55" and the night, claimed by date, had never been slept).
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

__all__ = ["LATE", "night_due"]

#: How long after ``sleep_time`` a night past midnight is still slept: many checks (a long pass over many
#: chats, a restart), yet far from the next one (a bot first started at noon does not sleep "last night").
LATE = timedelta(hours=3)


def night_due(now: datetime, zone: ZoneInfo | None, sleep_time: str) -> str | None:
    """The local date ("YYYY-MM-DD") of the night due at ``now`` in ``zone`` (None: ``now``'s own), or None."""
    local = now.astimezone(zone) if zone is not None else now
    if f"{local:%H:%M}" >= sleep_time:  # ("HH:MM", as the settings write it)
        return f"{local:%Y-%m-%d}"
    yesterday = local.date() - timedelta(days=1)
    hour, minute = (int(part) for part in sleep_time.split(":"))
    due = datetime.combine(yesterday, time(hour, minute), local.tzinfo)
    # In UTC: the same tzinfo on both sides would subtract wall clocks (an hour off across a DST change)
    return f"{yesterday:%Y-%m-%d}" if now.astimezone(UTC) - due.astimezone(UTC) <= LATE else None
