"""The 待批准 side panel (the web playground shows it): a chat's paused requests, with buttons.

Each row shows only what the chat already saw: the code, the call's summary, who asked and when
the code expires; never the run state. A row's buttons (keys starting with ``/``) send
``/approve CODE`` or ``/deny CODE`` as the page's current identity, so the bot's usual checks
decide who may approve; the panel grants nothing. In an approver's private chat the panel also
lists what waits for their approval in the platform's other chats (as ``/pending`` does); and the
approvers' notices of a new request (:func:`approver_notices`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from function_calls import Caller
from robot import snapshots
from robot.message import ChatRef, OutgoingMessage
from robot.snapshots import Row, summarize
from robot.store import parse_iso

if TYPE_CHECKING:
    from robot.approvals import Approvals

__all__ = ["PANEL", "PendingPanel", "approver_notices", "pending_text"]

log = logging.getLogger(__name__)

#: The panel's name in ``bot.panels``.
PANEL = "待批准"
_WAITING = {("input", "requester"): "发起人回答", ("approval", "requester"): "发起人确认",
            ("approval", "admin"): "管理员批准"}


class PendingPanel:
    """A :data:`robot.channels.base.PanelProvider` for paused requests; also names a platform's approvers."""

    def __init__(self, approvals: Approvals) -> None:
        self.approvals = approvals

    def approvers(self, platform: str) -> list[str]:
        """User ids on ``platform`` that ``[bot] admins`` / ``[approvals] approvers`` list."""
        settings = self.approvals.bot.settings
        qualified = [*settings.bot.admins, *self.approvals.settings.approvers]
        return list(dict.fromkeys(q.split(":", 1)[1] for q in qualified if q.split(":", 1)[0] == platform))

    async def __call__(self, chat: ChatRef) -> list[dict[str, str]]:
        store, now = self.approvals.store, self.approvals.bot.clock()
        rows = await store.pending(now, chat=chat.key)
        if chat.kind == "private" and chat.chat_id in self.approvers(chat.platform):
            seen = {r["id"] for r in rows}
            rows += [r for r in await store.pending(now, admin_only=True, platform=chat.platform) if r["id"] not in seen]
            rows.sort(key=lambda r: str(r["created_at"]))
        return [self._row(r, chat) for r in rows]

    def _row(self, row: Row, chat: ChatRef) -> dict[str, str]:
        code = str(row["code"])
        trusted = self.approvals.store.verify(row)
        try:
            asker = Caller.model_validate_json(str(row["caller"])).user_name or str(row["requester"])
        except ValueError:
            asker = str(row["requester"])
        if row["chat"] != chat.key:
            where = ChatRef.from_key(str(row["chat"]))
            asker += f"（{'群聊 ' + where.chat_id if where.kind == 'group' else '私聊'}）"
        expires = parse_iso(str(row["expires_at"]))
        left = max(1, math.ceil((expires - self.approvals.bot.clock()).total_seconds() / 60))
        local = expires.astimezone(self.approvals.bot.zone_for(chat))
        out = {"码": code, "等待": _WAITING.get((str(row["kind"]), str(row["approver"])), "处理"),
               "内容": summarize(row) if trusted else "（记录校验失败：批准会被拒绝）",
               "发起人": asker, "到期": f"{local:%H:%M}（还剩 {left} 分钟）"}
        if row["kind"] == "approval":
            out |= {"/批准": f"/approve {code}", "/拒绝": f"/deny {code}"}
        return out


_MINE = {("input", "requester"): "等你回答", ("approval", "requester"): "等你确认", ("approval", "admin"): "等管理员批准"}


async def pending_text(approvals: Approvals, caller: Caller) -> str:
    """``/pending``: what waits for me, and what waits for my approval."""
    now = approvals.bot.clock()
    # In a group only that group's requests: others (a private chat's arguments) are read out there.
    here = ChatRef.of(caller).key if caller.chat_kind == "group" else None
    lines = [f"· {r['code']} {_MINE[(r['kind'], r['approver'])]}：{summarize(r)}"
             for r in await approvals.store.pending(now, requester=caller.qualified_user) if here in (None, r["chat"])]
    if caller.qualified_user in approvals.approver_ids():
        lines += [f"· {r['code']} 等你批准（{r['requester']} 在 {r['chat']}）：{summarize(r)}"
                  for r in await approvals.store.pending(now, admin_only=True) if here in (None, r["chat"])]
    if not lines:
        return "没有等待中的请求。"
    return "等待中的请求：\n" + "\n".join(lines) + "\n批准：/approve 码；拒绝：/deny 码 [理由]"


def approver_notices(approvers: list[str], chat: ChatRef, code: str, what: str, caller: Caller) -> list[OutgoingMessage]:
    """The notices of a request paused in ``chat`` for ``approvers`` (qualified ids) on the chat's platform:
    @-ed in a group, privately otherwise."""
    same = [q.split(":", 1)[1] for q in approvers if q.split(":", 1)[0] == chat.platform]
    if not same:
        log.warning("an approval waits, but no approver is configured on %s ([bot] admins, [approvals] "
                    "approvers)", chat.platform)
        return []
    text = f"{caller.user_name or caller.user_id} 请求执行 {what}，需要批准：/approve {code} 批准，/deny {code} 拒绝。"
    key = snapshots.notice_key(chat, caller.user_id) + code  # and ``about``: the requester's /forget me finds them
    if chat.kind == "group":
        return [OutgoingMessage(key=f"{key}:group", chat=chat, text=text, mention=tuple(same), about=caller.user_id)]
    return [OutgoingMessage(key=f"{key}:{user_id}", chat=chat.model_copy(update={"chat_id": user_id, "kind": "private"}),
                            about=caller.user_id, text=f"{snapshots.notice_prefix(chat)}{text}")
            for user_id in same if user_id != caller.user_id]
