"""The 待批准 side panel (the web playground shows it): a chat's paused requests, with buttons.

Each row shows only what the chat already saw: the code, the call's summary, who asked and when
the code expires; never the run state. A row's buttons (keys starting with ``/``) send
``/approve CODE`` or ``/deny CODE`` as the page's current identity, so the bot's usual checks
decide who may approve; the panel grants nothing (it names who may: the requester, or the
approvers). In an approver's private chat the panel also lists what waits for their approval in the
platform's other chats (as ``/pending`` does); and the approvers' notices of a new request
(:func:`approver_notices`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from function_calls import Caller
from robot import snapshots
from robot.channels.base import ACCOUNT_LEASE
from robot.message import ChatRef, OutgoingMessage
from robot.snapshots import Row, summarize
from robot.store import parse_iso

if TYPE_CHECKING:
    from robot.approvals import Approvals

__all__ = ["PANEL", "PendingPanel", "admin_prompt", "approver_notices", "pending_text"]

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
            # Who the bot lets press them (``@``, see robot.channels.web.panels): the requester alone, or an approver.
            platform, requester = str(row["requester"]).split(":", 1)
            mine = [requester] if platform == chat.platform else []
            out["@"] = " ".join(mine if row["approver"] == "requester" else self.approvers(chat.platform))
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


async def approver_notices(approvals: Approvals, chat: ChatRef, code: str, what: str,
                           caller: Caller) -> list[OutgoingMessage]:
    """The notices of a request paused in ``chat``: approvers on the chat's platform are @-ed in a group, told
    privately otherwise; those on another platform privately there. One who cannot be reached (no channel for
    their platform, no telling which account reaches them) is logged and skipped; [] when nobody is reached."""
    approvers = [q for q in dict.fromkeys(approvals.approver_ids()) if q != caller.qualified_user]
    same = [q.split(":", 1)[1] for q in approvers if q.split(":", 1)[0] == chat.platform]
    text = f"{caller.user_name or caller.user_id} 请求执行 {what}，需要批准：/approve {code} 批准，/deny {code} 拒绝。"
    key = snapshots.notice_key(chat, caller.user_id) + code  # and ``about``: the requester's /forget me finds them
    out: list[OutgoingMessage] = []
    if same and chat.kind == "group":
        out.append(OutgoingMessage(key=f"{key}:group", chat=chat, text=text, mention=tuple(same), about=caller.user_id))
    elif same:
        out += [OutgoingMessage(key=f"{key}:{user_id}", chat=chat.model_copy(update={"chat_id": user_id}),
                                about=caller.user_id, text=f"{snapshots.notice_prefix(chat)}{text}") for user_id in same]
    # Elsewhere without the call or the requester's name: /forget me looks for copies on their own platform only.
    where = f"{chat.platform} {'群聊 ' + chat.chat_id if chat.kind == 'group' else '私聊'}"
    brief = f"（来自 {where}）有一个请求需要批准：/approve {code} 批准，/deny {code} 拒绝；发送 /pending 查看内容。"
    for qualified in approvers:
        platform, user_id = qualified.split(":", 1)
        if platform == chat.platform:
            continue
        account = await _account(approvals, platform)
        if account is None:
            log.warning("an approval waits, but approver %s cannot be notified: %s", qualified,
                        f"no {platform} channel runs" if platform not in approvals.bot.channels else
                        f"{platform} has several accounts (or none connected): which one reaches them is unknown")
            continue
        out.append(OutgoingMessage(key=f"{key}:{platform}:{user_id}", about=caller.user_id, text=brief,
                                   chat=ChatRef(platform=platform, chat_id=user_id, kind="private", account=account)))
    if not out:
        log.warning("an approval waits in %s, but no approver can be notified ([bot] admins, [approvals] "
                    "approvers)", chat.key)
    return out


async def _account(approvals: Approvals, platform: str) -> str | None:
    """The account a private message on ``platform`` leaves through: "" where the platform has one connection,
    its only account (live in any process) where it has several; None when it cannot be told."""
    channel = approvals.bot.channels.get(platform)
    if channel is None:
        return None
    if not channel.account_leases:
        return ""
    if default := channel.default_account():
        return default
    prefix = ACCOUNT_LEASE.format(platform=platform, account="")
    accounts = {name[len(prefix):] for name in await approvals.bot.leases.leases.holders(prefix)}
    return accounts.pop() if len(accounts) == 1 else None


def admin_prompt(what: str, code: str, minutes: int, *, notified: bool, own: bool) -> str:
    """What the requester of an admin's approval is told: whether an approver was notified (or may be them)."""
    how = f"/approve {code} 批准，/deny {code} 拒绝"
    if notified:
        return f"这个操作需要管理员批准：{what}。已通知管理员，批准后我会继续；管理员可回复 {how}（{minutes} 分钟内有效）。"
    if own:
        return f"这个操作需要管理员批准：{what}。你是管理员，可回复 {how}（{minutes} 分钟内有效）。"
    return (f"这个操作需要管理员批准：{what}。目前没有能通知到的管理员，请自行联系管理员；请求保留 {minutes} 分钟，"
            f"管理员可回复 {how}。")
