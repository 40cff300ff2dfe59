"""``/forget me``: a person's data leaves the bot, with no copy left behind.

In the chat where it is sent (or, ``/forget me all`` in a private chat, in every chat):
the person's stored messages; the bot's replies to them and messages addressed to them (an @:
their reminders firing; in a private chat, every bot message there: the whole conversation was
with them); the approvers' notices quoting their requests; the text of the outbox rows of those; the
paused runs that froze the conversation (the chat's finished ones and theirs; their lines taken out of
another member's, which is signed anew); and whatever plugins registered a :class:`Forgetter` for
(reminders, summaries that may quote them, memories). On SQLite deleted pages are overwritten
(``PRAGMA secure_delete``, see :mod:`robot.store`) and the WAL is checkpointed and truncated
afterwards, so the text survives in no file; PostgreSQL
keeps dead row versions until VACUUM and its WAL until the next checkpoints (its operator's policy).
What a process keeps in memory for the next message's context goes too, in every process sharing
the database (a notification; after a gap in those, each drops all of it).

A person must type the command: the model is never allowed to run it (a message in the chat
could talk it into erasing someone's data).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, Field

from function_calls import (
    FunctionCallRouter,
    RunState,
    ToolContext,
    ToolError,
    ToolResult,
    Toolset,
    tool_function,
)
from function_calls.router import said_by
from function_calls.tokens import forget_texts
from robot.history import FORGOTTEN, TO_USER, HistoryStore, drop_windows
from robot.hooks import ForgetHook
from robot.message import ChatRef
from robot.snapshots import SnapshotStore, notice_key, notice_prefix
from robot.storage import Tx
from robot.storage.base import in_chunks
from robot.store import Engine

if TYPE_CHECKING:
    from robot.approvals import Approvals

__all__ = [
    "COMMAND_ONLY",
    "ForgetArgs",
    "ForgetHost",
    "ForgetReport",
    "ForgetRequest",
    "Forgetter",
    "bytewise",
    "drop_caches",
    "follow_forgets",
    "forget",
    "forget_everything",
    "forget_sync",
    "toolset",
    "traces_sync",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForgetRequest:
    """Whose data goes, and from which chats.

    ``everywhere`` (``/forget me all``): every chat on the person's platform; ``chats`` then lists
    the chats where the bot holds a trace of them (their messages, messages to them), found
    before anything was deleted. A store keyed by owner (reminders, memories) deletes by owner.
    """

    platform: str
    user_id: str
    chats: tuple[ChatRef, ...]
    everywhere: bool = False

    def covers(self, chat_key: str) -> bool:
        """Whether a chat (by key) is within this request."""
        if self.everywhere:
            return chat_key.startswith(f"{self.platform}:")
        return chat_key in {c.key for c in self.chats}


@dataclass(frozen=True)
class Forgetter:
    """A plugin's part of ``/forget me``: ``forget`` deletes what it holds and returns how many.

    Register with ``bot.forgetters.append(...)`` in the plugin's setup. ``unit`` names what was
    counted in the reply (``"个提醒"``, ``"条记忆"``).
    """

    name: str
    unit: str
    forget: Callable[[ForgetRequest], Awaitable[int]]


@dataclass
class ForgetReport:
    """What one forget deleted, by kind, in the order shown to the person."""

    counts: list[tuple[str, int]]

    def total(self) -> int:
        return sum(n for _, n in self.counts)

    def text(self, where: str) -> str:
        parts = [f"{n} {unit}" for unit, n in self.counts if n]
        if not parts:
            return f"{where}没有你的记录，无需删除。"
        return f"已删除你在{where}的记录：" + "、".join(parts) + "。"


def forget_sync(db: Tx, request: ForgetRequest, snapshots: SnapshotStore | None = None) -> tuple[int, int]:
    """The core part, in one transaction: (the person's messages, the bot's replies) deleted. ``snapshots``
    signs anew the paused runs their words are taken out of (without it those are refused when approved)."""
    messages = replies = 0
    requester = f"{request.platform}:{request.user_id}"
    c = bytewise(db)
    for chat in request.chats:
        key = chat.key
        # A paused run freezes the conversation: the chat's finished ones (any may quote them) and
        # their own waiting ones go; a run being resumed right now ('approved') finishes first.
        db.execute("DELETE FROM snapshots WHERE chat = ? AND status != 'approved' AND "
                   "(status != 'pending' OR requester = ?)", [key, requester])
        # The approvers' notices quote their calls: in the chat (an @ of the admins), in admins' private chats.
        notices, private, prefix = notice_key(chat, request.user_id), f"{request.platform}:private:", notice_prefix(chat)
        _unsend(db, "substr(key, 1, ?) = ?", [len(notices), notices])
        replies += db.execute(f"DELETE FROM history WHERE chat{c} >= ? AND chat{c} < ? AND from_bot = 1 AND "
                              "to_user = ? AND substr(text, 1, ?) = ?", [private, private[:-1] + ";", request.user_id,
                                                                         len(prefix), prefix]).rowcount
        ids = [row[0] for row in db.execute(
            "SELECT message_id FROM history WHERE chat = ? AND user_id = ? AND from_bot = 0 AND message_id != ''",
            [key, request.user_id]).fetchall()]
        messages += db.execute("DELETE FROM history WHERE chat = ? AND user_id = ? AND from_bot = 0",
                               [key, request.user_id]).rowcount
        if chat.kind == "private":  # a private chat is one conversation with them: every bot message there goes
            replies += db.execute("DELETE FROM history WHERE chat = ? AND from_bot = 1", [key]).rowcount
            _unsend(db, "chat = ?", [key])
            _strip_snapshots(db, key, request, [], snapshots)
            continue
        # Bot messages addressed to them (@ them: answers, their reminders firing) go with their messages.
        to_them = [key, request.user_id, request.user_id]
        said = [str(r[0]) for r in db.execute(f"SELECT text FROM history WHERE {TO_USER}", to_them).fetchall()]
        replies += db.execute(f"DELETE FROM history WHERE {TO_USER}", to_them).rowcount
        _blank_mentioning(db, key, request.user_id)
        for batch, marks in in_chunks(ids):
            answers = f"FROM history WHERE chat = ? AND from_bot = 1 AND reply_to IN ({marks})"
            said += [str(r[0]) for r in db.execute(f"SELECT text {answers}", [key, *batch]).fetchall()]
            replies += db.execute(f"DELETE {answers}", [key, *batch]).rowcount
            _unsend(db, f"chat = ? AND reply_to IN ({marks})", [key, *batch])
        _strip_snapshots(db, key, request, said, snapshots)
    HistoryStore.prune_addressees_sync(db)
    return messages, replies


def _strip_snapshots(db: Tx, chat: str, request: ForgetRequest, said: list[str], store: SnapshotStore | None) -> None:
    """The paused runs left in ``chat`` (another member's, waiting or running; their own running one) keep no
    line of theirs: their messages and the bot's replies to them (``said``) leave the frozen conversation (all
    of their own run's goes), and the row is signed anew; one that failed its check is not (an edit is never
    laundered) and is refused when approved. (A run resuming in memory right now still holds its copy.)"""
    requester = f"{request.platform}:{request.user_id}"
    theirs = said_by(request.user_id)
    replies = {_unfolded(t) for t in said}

    def quotes(m: dict[str, Any]) -> bool:
        content = m.get("content")
        if not isinstance(content, str):
            return False
        if m.get("role") == "user":  # a history line of theirs (the message a run answers has no header)
            return bool(theirs.match(content))
        return m.get("role") == "assistant" and not m.get("tool_calls") and _unfolded(content) in replies

    for row in db.execute_returning_dicts(
            "SELECT * FROM snapshots WHERE chat = ? AND status IN ('pending', 'approved')", [chat]):
        try:
            state, whole = RunState.model_validate_json(str(row["state"])), row["requester"] == requester
        except ValueError:
            state, whole = RunState(messages=[]), True  # unreadable: nothing of it is kept
        kept = [m for m in state.messages if not quotes(m)]
        if not whole and len(kept) == len(state.messages):
            continue
        trusted = store is not None and store.verify(row)
        row["state"] = (RunState(messages=[]) if whole else state.model_copy(update={"messages": kept})).model_dump_json()
        mac = store.mac(row) if store is not None and trusted else str(row["mac"])
        # Their own run's record of what its calls did names their arguments too: "maybe run" is all it keeps.
        ran = "CASE WHEN ran IS NULL THEN NULL ELSE '[]' END" if whole else "ran"
        db.execute(f"UPDATE snapshots SET state = ?, mac = ?, ran = {ran} WHERE id = ?", [row["state"], mac, row["id"]])


def _unfolded(text: str) -> str:
    """A bot message as history keeps it and as a run's window shows it (speaker-like lines indented) alike."""
    return "\n".join(line.removeprefix("  | ") for line in text.splitlines())


def _unsend(db: Tx, where: str, params: list[Any]) -> None:
    """The outbox rows ``where`` picks: those still waiting never go out (they quote the person: a reply
    queued while the platform was down went out after /forget me), the others keep no text."""
    db.execute(f"DELETE FROM outbox WHERE {where} AND status = 'pending'", params)
    db.execute(f"UPDATE outbox SET text = '', mention = '[]' WHERE {where} AND status != 'pending'", params)


def _blank_mentioning(db: Tx, chat: str, user_id: str) -> None:
    """Clear the text of the chat's outbox rows that @ the person (alone or with others: a reminder message
    shared by a chat's people); one still waiting that @s them alone never goes out."""
    rows = db.execute("SELECT key, mention, status FROM outbox WHERE chat = ? AND text != '' AND mention != '[]'",
                      [chat]).fetchall()
    mentioning = [(str(k), json.loads(str(mention)), status) for k, mention, status in rows]
    keys = [k for k, mention, status in mentioning if user_id in mention and status != "pending"]
    alone = [k for k, mention, status in mentioning if mention == [user_id] and status == "pending"]
    for batch, marks in in_chunks(keys):
        db.execute(f"UPDATE outbox SET text = '', mention = '[]' WHERE key IN ({marks})", batch)
    for batch, marks in in_chunks(alone):
        db.execute(f"DELETE FROM outbox WHERE key IN ({marks})", batch)


def bytewise(db: Tx) -> str:
    """The collation that makes a key range (``chat >= 'wx:private:' AND chat < 'wx:private;'``) a
    prefix: SQLite compares bytes already; a PostgreSQL database's own collation may not."""
    return ' COLLATE "C"' if db.dialect == "postgresql" else ""


def traces_sync(db: Tx, platform: str, user_id: str) -> tuple[ChatRef, ...]:
    """Every chat on ``platform`` holding a trace of the person, and their private chat."""
    prefix = f"{platform}:"
    rows = db.execute("SELECT DISTINCT chat FROM history WHERE substr(chat, 1, ?) = ? AND "
                      "((user_id = ? AND from_bot = 0) OR (from_bot = 1 AND (to_user = ? OR id IN "
                      "(SELECT history_id FROM history_to WHERE user_id = ?))))",
                      [len(prefix), prefix, user_id, user_id, user_id]).fetchall()
    own = f"{platform}:private:{user_id}"
    # Another person's private chat is theirs (an approver's notice about this person is found by
    # forget_sync from the chat the request came from): never take it whole.
    keys = {str(r[0]) for r in rows if str(r[0]) == own or not str(r[0]).startswith(f"{platform}:private:")} | {own}
    return tuple(ChatRef.from_key(k) for k in sorted(keys))


class ForgetHost(Protocol):
    """What forgetting needs from the bot (the core tool's ``ctx.deps``)."""

    db: Engine
    forgetters: list[Forgetter]
    forget_hooks: list[ForgetHook]
    router: FunctionCallRouter | None
    approvals: Approvals


def drop_caches(bot: ForgetHost, chats: list[str] | None) -> None:
    """Keep no copy in memory either: what was kept to format and count the next message's context
    (``chats``' history windows; None: every chat's)."""
    drop_windows(chats)
    forget_texts()
    if bot.router is not None:
        bot.router.forget_shown()


def follow_forgets(bot: ForgetHost) -> None:
    """Drop this process's caches when another process sharing the database forgets someone, and
    all of them when its notifications were cut for a while (one of those may have been missed)."""
    bot.db.subscribe(FORGOTTEN, lambda payload: drop_caches(bot, None if payload == "*" else json.loads(payload)))
    bot.db.after_gap(lambda: drop_caches(bot, None))


async def forget_everything(bot: ForgetHost, request: ForgetRequest) -> ForgetReport:
    """Run the core forget and every plugin's :class:`Forgetter`, then leave no copy in the WAL or
    the caches of the next message's context."""
    def work(db: Tx) -> tuple[int, int]:
        done = forget_sync(db, request, bot.approvals.store)
        # Every chat's window, in every process: rows went in chats beyond the request's too (an
        # approver's private notices, summaries quoting the person). Forgets are rare; rebuilding is cheap.
        db.notify(FORGOTTEN, "*")
        return done

    messages, replies = await bot.db.transaction(work)
    counts = [("条消息", messages), ("条机器人回复", replies)]
    failed: list[str] = []
    for forgetter in bot.forgetters:
        try:
            counts.append((forgetter.unit, await forgetter.forget(request)))
        except Exception:
            log.exception("forget: %s failed", forgetter.name)
            failed.append(forgetter.name)
    await bot.db.checkpoint()
    drop_caches(bot, None)
    if failed:  # never claim a deletion that did not happen
        raise ToolError(f"forgetting failed in {', '.join(failed)}",
                        user_message="删除时出错了，部分记录可能还在，请稍后再发送一次 /forget me。")
    return ForgetReport(counts)


class ForgetArgs(BaseModel):
    """What to forget: only the caller's own data can be."""

    target: str = Field(pattern=r"^(me|#?\d{1,12})$",
                        description='"me": your own stored data; or the id of one item (a memory) to delete')
    where: Literal["here", "all"] = Field(
        default="here", description='"here": this chat; "all": every chat (send it in a private chat)')


@tool_function(examples=["/forget me", "/forget me all", "/forget 12"])
async def forget(ctx: ToolContext[ForgetHost], args: ForgetArgs) -> ToolResult:
    """删除你的记录 (forget me)：删除你在本聊天被记录的消息、机器人对它们的回复、你在这里设的提醒（也会取消）；
    私聊中发送 /forget me all 删除你在所有聊天的记录；/forget <编号> 删除一条记忆。"""
    caller = ctx.caller
    if ctx.via != "command":
        raise ToolError("forgetting a person's data needs them to send `/forget me` themselves; tell them so",
                        user_message="要删除你的记录，请直接发送 /forget me。")
    if args.target != "me":  # one item by id: the plugin that owns it says what it deleted (or refuses)
        item = args.target.lstrip("#")
        if args.where == "all":  # two commands in one: do neither rather than guess
            return ToolResult.reply(f"没有删除任何内容：删除一条记录请发送 /forget {item}（不带 all）；"
                                    "删除你在所有聊天的记录请在私聊中发送 /forget me all。")
        for hook in ctx.deps.forget_hooks:
            said = await hook(caller, item)
            if said:
                return ToolResult.reply(said)
        return ToolResult.reply(f"没有找到编号为 {item} 的记录。")
    if args.where == "all" and caller.chat_kind == "group":
        return ToolResult.reply("/forget me all 会删除你在所有聊天的记录，请在私聊中发送给我。")
    everywhere = args.where == "all"
    if everywhere:
        chats = await ctx.deps.db.run(lambda db: traces_sync(db, caller.platform, caller.user_id))
    else:
        chats = (ChatRef.of(caller),)
    request = ForgetRequest(caller.platform, caller.user_id, chats, everywhere=everywhere)
    report = await forget_everything(ctx.deps, request)
    where = "所有聊天" if everywhere else ("本群" if caller.chat_kind == "group" else "本聊天")
    return ToolResult.reply(report.text(where), data={"deleted": dict((u, n) for u, n in report.counts)})


toolset = Toolset("core", [forget])
#: Core tools a person must type: never offered to the model.
COMMAND_ONLY = frozenset({"forget"})
