"""What a run that stops short tells the person, and which of its tool calls already took effect.

Each text is a pair: what happened, and what to do about it ("请稍后再试"). Once a call of the run took
effect (a payment), or may have (it failed or was cut after it started), the second part gives way to
those calls and a warning not to simply ask again: asking again would run them twice. A refused call
never ran, and a ``read_only`` tool's changed nothing: neither is named.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence

from function_calls.problems import mend_text
from function_calls.run import StopReason, ToolTrace

__all__ = ["STOP_TEXTS", "TOO_COMPLEX", "TOO_LARGE", "UNREADABLE", "busy", "describe_call", "done_calls",
           "may_have_acted", "maybe_calls", "told_text"]

#: Each text as (what happened, what to do: with its punctuation, left out once a call took effect).
STOP_TEXTS: dict[StopReason, tuple[str, str]] = {
    # The loop guards' details are English diagnostics: they stay in the result and the trace.
    StopReason.LOOP_CRITICAL: ("我好像在原地打转（同样的操作重复了多次），先停下来了", "。请换个说法或稍后再试。"),
    StopReason.LOOP_BREAKER: ("本次请求重复调用过多，已强制停止", "。"),
    StopReason.TOOL_RETRIES_EXHAUSTED: ("我没能正确使用工具 {detail}", "，请换个说法再试。"),
    StopReason.MODEL_ERROR: ("AI 服务暂时不可用（{detail}）", "，请稍后再试。"),
    StopReason.DAILY_BUDGET: ("今天的 AI 用量已达上限", "，明天再来吧。"),
    StopReason.AWAITING_APPROVAL: ("这个操作需要管理员批准：{detail}", ""),
    StopReason.EMPTY_ANSWER: ("我这次没能给出回答（{detail}）", "，请换个说法再试。"),
}
UNREADABLE: tuple[str, str] = ("暂时无法核对 AI 用量额度", "，请稍后再试。")
TOO_LARGE: tuple[str, str] = ("这个请求太长了，超出了单次对话的用量上限", "，请精简后再问。")
TOO_COMPLEX: tuple[str, str] = ("这个请求太复杂了，我在限额内没能完成", "，请拆小一点再问。")
_AGAIN = "请勿直接重复请求，以免重复执行。"
_SHOWN_CALLS = 3
_ARGS_CHARS = 60


def busy(seconds: float | None) -> tuple[str, str]:
    """The provider asked to wait longer than a request waits: when to come back."""
    seconds = seconds or 0.0
    if seconds < 90:
        wait = f" {max(1, round(seconds))} 秒"
    elif seconds < 5400:
        wait = f"约 {round(seconds / 60)} 分钟"
    else:
        wait = f"约 {round(seconds / 3600)} 小时"
    return "AI 服务繁忙", f"，请{wait}后再试。"


def told_text(told: tuple[str, str], trace: Sequence[ToolTrace]) -> str:
    """``told`` as it reads when no call may have acted; else what happened, the calls that did and those
    that may have (failed or cut after they started: a payment whose answer timed out), and no retry."""
    said = "。".join(f"{head}：{calls}" for head, calls in (("已执行", done_calls(trace)),
                                                           ("可能已执行", maybe_calls(trace))) if calls)
    return f"{told[0]}。{said}。{_AGAIN}" if said else told[0] + told[1]


def may_have_acted(call: ToolTrace) -> bool:
    """Whether a call may have changed something: its handler started (a refused call never ran) and its
    tool is not declared ``read_only``."""
    return not (call.refused or call.read_only)


def done_calls(trace: Sequence[ToolTrace]) -> str:
    """The calls that may have acted and ran without an error: see :func:`_listed`."""
    return _listed([t for t in trace if may_have_acted(t) and not t.is_error])


def maybe_calls(trace: Sequence[ToolTrace]) -> str:
    """The calls that may have acted but ended in an error (raised, timed out, cut): see :func:`_listed`."""
    return _listed([t for t in trace if may_have_acted(t) and t.is_error])


def _listed(trace: Sequence[ToolTrace]) -> str:
    """Each call once with how often, the first few only; "" when there are none."""
    counts = Counter((t.name, t.arguments) for t in trace)
    shown = [describe_call(name, args) + (f"×{n}" if n > 1 else "") for (name, args), n in counts.items()]
    more = f" 等 {counts.total()} 次调用" if len(shown) > _SHOWN_CALLS else ""
    return "、".join(shown[:_SHOWN_CALLS]) + more


def describe_call(name: str, arguments: str, limit: int = _ARGS_CHARS, *, floor: int = 16, brackets: str = "（）",
                  bounded: bool = True) -> str:
    """``name（key=value, …）`` for people: values as JSON (a string cannot pose as more keys), runs of
    spaces folded, each cut to its share of ``limit`` (at least ``floor``) so that none hides the others (a
    padded memo hid the amount after it: an approver saw ``amount=5`` and approved 50000). ``bounded``: keys
    cut to a share too and the whole to twice ``limit`` (a call with 100 keys); an approval's notice
    (:func:`robot.snapshots.describe_call`) shows every key in full instead."""
    try:
        args = json.loads(arguments or "{}")
    except (ValueError, TypeError, RecursionError):
        args = arguments
    items = list(args.items()) if isinstance(args, dict) else [("", args)]
    share = max(floor, limit // max(1, len(items)))
    shown = []
    for key, value in items:
        try:
            text = re.sub(r"\s+", " ", json.dumps(value, ensure_ascii=False))
        except (ValueError, RecursionError):  # (a description must never fail)
            text = "…"
        text = text if len(text) <= share else f"{text[:share - 1]}…（共 {len(text)} 字）"
        shown.append(f"{key[:share] if bounded else key}={text}" if key else text)
    joined = ", ".join(shown)
    if bounded and len(joined) > 2 * limit:
        joined = f"{joined[:2 * limit - 1]}…"
    return mend_text(f"{name}{brackets[0]}{joined}{brackets[1]}")  # (half an emoji in an argument must not stop it)
