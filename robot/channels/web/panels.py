"""The playground's side panels: frames built from the bot's panel providers, and who may approve.

A provider returns rows of ``{label: value}``. A key starting with ``/`` is a button instead of a
field: its label is the rest of the key and its value is the ``/command`` the button sends as the
page's current identity (e.g. ``{"/批准": "/approve LQ5RZ"}``). A button is only a shortcut for
typing: the bot checks the identity as for any message. The key ``@`` names who it lets press a
row's buttons (user ids on the chat's platform, separated by spaces), so that the page can say
whether the current identity may; it is not shown. A provider that also has an
``approvers(platform)`` method (:class:`ApproverSource`) names the identities that may approve;
the page offers and marks them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from robot.channels.base import PanelProvider
from robot.channels.web.protocol import MAX_TEXT, address
from robot.message import ChatRef

__all__ = ["ApproverSource", "members", "panel_frame", "split_row"]

log = logging.getLogger(__name__)
_ROWS = 50  # rows shown per panel
_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # ids a page can speak as (protocol.UserRef)


@runtime_checkable
class ApproverSource(Protocol):
    """A panel provider that knows which users of a platform may approve paused requests."""

    def approvers(self, platform: str) -> list[str]: ...


def split_row(row: Mapping[Any, Any]) -> tuple[dict[str, str], list[dict[str, str]]]:
    """A provider's row as shown fields and buttons (``{"label", "text"}``; only ``/commands``)."""
    fields: dict[str, str] = {}
    buttons: list[dict[str, str]] = []
    for key, value in row.items():
        label, text = str(key), str(value)
        if label == "@":
            continue
        if not label.startswith("/"):
            fields[label] = text
        elif text.startswith("/") and len(text) <= MAX_TEXT and label[1:].strip():
            buttons.append({"label": label[1:].strip()[:16], "text": text})
        else:
            log.warning("web panel button %r is not a /command; not shown", label[:40])
    return fields, buttons


async def panel_frame(providers: Mapping[str, PanelProvider], chat: ChatRef) -> dict[str, Any]:
    """The ``panels`` frame for one chat; a failing provider shows an error, the others still show."""
    panels: list[dict[str, Any]] = []
    for name, provider in list(providers.items()):
        try:
            raw = (await provider(chat))[:_ROWS]
            rows = [split_row(row) for row in raw]
        except Exception:
            log.exception("web panel %r failed for %s", name, chat.key)
            panels.append({"name": name, "rows": [], "error": "could not load this panel"})
            continue
        panel: dict[str, Any] = {"name": name, "rows": [fields for fields, _ in rows]}
        if any(buttons for _, buttons in rows):
            panel["actions"] = [buttons for _, buttons in rows]
        if any("@" in row for row in raw):
            panel["actors"] = [str(row["@"]).split() if "@" in row else None for row in raw]
        panels.append(panel)
    return {"type": "panels", "chat": address(chat), "panels": panels}


def members(providers: Mapping[str, PanelProvider], platform: str,
            presets: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """The page's preset identities, then the platform's approvers (each marked ``"approver": true``)."""
    approvers: list[str] = []
    for provider in list(providers.values()):
        if isinstance(provider, ApproverSource):
            try:
                approvers += [a for a in provider.approvers(platform) if _ID.fullmatch(a)]
            except Exception:  # fail closed: nobody is shown as an approver
                log.exception("web panel could not list approvers")
    approvers = list(dict.fromkeys(approvers))
    out: list[dict[str, Any]] = [{"id": uid, "name": name, **({"approver": True} if uid in approvers else {})}
                                 for uid, name in presets]
    known = {uid for uid, _ in presets}
    out += [{"id": a, "name": a[:32], "approver": True} for a in approvers if a not in known]
    return out
