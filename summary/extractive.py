"""Who said what (by id), and the summary that needs no model.

Speakers are told apart by their platform id; a display name is only a label, since anyone
can pick any nickname. A speaker renders as ``名字(id)`` with the latest name they used, and
earlier names are listed once as aliases; the bot's own messages render as ``名字[机器人]``.
Names lose brackets, colons and line breaks, and a message's line breaks are folded, so text
cannot forge another speaker's transcript line.

Without an LLM, :func:`extractive_summary` reports the message count, the period, the most
active members (stickers, 哈哈, +1 and the bot not counted), then four sections: 结论/决定 and
待办 (who, what, when) found by :mod:`summary.signals`, 话题 (the most salient other messages by a
simple score: length, questions, links, numbers and times, the responses a message got) and
链接 (every link, whole). Near-identical messages are quoted once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from robot import HistoryEntry
from summary.signals import Signals, classify, clip_keeping_links, is_noise, names_for_mentions, weekday

__all__ = [
    "BOT_TAG",
    "HEADER",
    "PRIVATE_HEADER",
    "Speaker",
    "Speakers",
    "clean_name",
    "extractive_summary",
    "mention_names",
    "near_duplicate",
    "one_line",
    "salient",
    "scores",
]

HEADER = "【群聊总结】"
PRIVATE_HEADER = "【聊天总结】"
"""The heading of a summary of a private chat (``HEADER`` is a group's)."""
BOT_TAG = "[机器人]"
_MAX_ALIASES = 5
_UNSAFE = re.compile(r"[()（）\[\]【】<>:：\x00-\x1f\x7f\u2028\u2029]")
_NORMALISE = re.compile(r"[\W_]+")
_LINK = re.compile(r"https?://|www\.", re.IGNORECASE)
_NUMBER = re.compile(r"\d|[一二三四五六七八九十两]+[点號号日月]|明天|后天|今晚|下周|周[一二三四五六日天]|星期")
_QUESTION = re.compile(r"[?？]|吗|怎么|什么|为什么|多少|哪|谁|\b(how|what|why|when|where|who)\b", re.IGNORECASE)
_RESPONSE_WINDOW = timedelta(minutes=10)


def clean_name(name: str, limit: int = 24) -> str:
    """A display name safe to put in a transcript: no brackets, colons or line breaks."""
    cleaned = " ".join(_UNSAFE.sub(" ", name).split())
    return cleaned[:limit] or "?"


def one_line(text: str) -> str:
    """One message as one transcript line: line breaks become `` / ``."""
    return " / ".join(part.strip() for part in text.splitlines() if part.strip())


@dataclass
class Speaker:
    """One person (or the bot) in a set of messages."""

    user_id: str
    name: str
    from_bot: bool = False
    aliases: list[str] = field(default_factory=list)
    count: int = 0

    @property
    def label(self) -> str:
        """``名字(id)``, or ``名字[机器人]`` for the bot."""
        return f"{self.name}{BOT_TAG}" if self.from_bot else f"{self.name}({clean_name(self.user_id, 64)})"

    @property
    def alias_note(self) -> str:
        """``（曾用名：a、b）`` when the id used other names, else empty."""
        return f"（曾用名：{'、'.join(self.aliases[-_MAX_ALIASES:])}）" if self.aliases else ""


class Speakers:
    """The speakers of some messages (oldest first), keyed by id; the last name seen wins."""

    def __init__(self, entries: Iterable[HistoryEntry]) -> None:
        self._by_key: dict[tuple[bool, str], Speaker] = {}
        for entry in entries:
            self._add(entry)

    def _add(self, entry: HistoryEntry) -> Speaker:
        key = (entry.from_bot, entry.user_id)
        name = clean_name(entry.name or entry.user_id)
        person = self._by_key.get(key)
        if person is None:
            person = self._by_key[key] = Speaker(entry.user_id, name, entry.from_bot)
        elif name != person.name:
            if person.name not in person.aliases:
                person.aliases.append(person.name)
            if name in person.aliases:
                person.aliases.remove(name)
            person.name = name
        person.count += 1
        return person

    def of(self, entry: HistoryEntry) -> Speaker:
        """The speaker of ``entry`` (added on the fly if it was not among the messages given)."""
        return self._by_key.get((entry.from_bot, entry.user_id)) or self._add(entry)

    def label(self, entry: HistoryEntry) -> str:
        return self.of(entry).label

    def members(self) -> list[Speaker]:
        """People (not the bot), most messages first."""
        people = [p for p in self._by_key.values() if not p.from_bot]
        return sorted(people, key=lambda p: -p.count)


def _normalised(text: str) -> str:
    return _NORMALISE.sub("", text.lower())


def _bigrams(text: str) -> set[str]:
    return {text[i:i + 2] for i in range(len(text) - 1)}


def near_duplicate(a: str, b: str) -> bool:
    """Whether two messages say practically the same thing (same words, punctuation and case aside)."""
    na, nb = _normalised(a), _normalised(b)
    if na == nb:
        return True
    if min(len(na), len(nb)) < 6:
        return False
    ga, gb = _bigrams(na), _bigrams(nb)
    return len(ga & gb) / len(ga | gb) >= 0.8


def scores(entries: Sequence[HistoryEntry]) -> list[float]:
    """A salience score per message; 0 for the bot's messages and for near-empty ones."""
    out: list[float] = []
    for i, entry in enumerate(entries):
        text = entry.text.strip()
        if entry.from_bot or len(_normalised(text)) < 4:
            out.append(0.0)
            continue
        question = bool(_QUESTION.search(text))
        score = min(len(text), 120) / 30 + (2.0 if question else 0.0)
        score += 2.0 if _LINK.search(text) else 0.0
        score += 1.5 if _NUMBER.search(text) else 0.0
        # History keeps no reply ids: others speaking right after count as responses.
        responders: set[str] = set()
        for later in entries[i + 1:i + 6]:
            if later.at - entry.at > _RESPONSE_WINDOW:
                break
            if not later.from_bot and later.user_id != entry.user_id:
                responders.add(later.user_id)
        out.append(score + len(responders) * (1.0 if question else 0.5))
    return out


def salient(entries: Sequence[HistoryEntry], count: int) -> list[int]:
    """Indexes of the ``count`` highest-scoring messages, near-duplicates skipped, in time order."""
    marks = scores(entries)
    chosen: list[int] = []
    for i in sorted(range(len(entries)), key=lambda i: (-marks[i], i)):
        if len(chosen) >= count or marks[i] <= 0:
            break
        if any(near_duplicate(entries[i].text, entries[j].text) for j in chosen):
            continue
        chosen.append(i)
    return sorted(chosen)


def mention_names(speakers: Speakers) -> dict[str, str]:
    """User id -> latest name of the people in ``speakers``, for :func:`summary.signals.names_for_mentions`."""
    return {p.user_id: p.name for p in speakers.members()}


def _stamp(moment: datetime, zone: ZoneInfo) -> str:
    local = moment.astimezone(zone)
    return f"{local:%m-%d} {weekday(local.weekday())} {local:%H:%M}"


@dataclass
class _Fact:
    index: int
    signals: Signals
    score: float


def _facts(entries: Sequence[HistoryEntry], texts: Sequence[str]) -> list[_Fact]:
    found: list[_Fact] = []
    for i, (entry, text) in enumerate(zip(entries, texts, strict=True)):
        if entry.from_bot:
            continue
        signals = classify(text)
        if not signals.fact:
            continue
        score = (3.0 if signals.decision else 0.0) + (2.0 if signals.action else 0.0)
        score += (1.0 if signals.when else 0.0) + (0.5 if signals.number else 0.0) + min(len(text), 120) / 60
        found.append(_Fact(i, signals, score))
    return found


def _pick(candidates: Sequence[int], ranked: Sequence[float], texts: Sequence[str], count: int,
          taken: list[int]) -> list[int]:
    chosen: list[int] = []
    for i in sorted(candidates, key=lambda i: (-ranked[i], i)):
        if len(chosen) >= count:
            break
        if any(near_duplicate(texts[i], texts[j]) for j in (*taken, *chosen)):
            continue
        chosen.append(i)
    return sorted(chosen)


def extractive_summary(
    entries: Sequence[HistoryEntry],
    *,
    zone: ZoneInfo,
    title: str,
    note: str = "",
    top_members: int = 5,
    salient_count: int = 5,
    fact_count: int = 12,
    link_count: int = 8,
    header: str = HEADER,
) -> str:
    """A summary without any model: count, period, most active members, then 结论/决定, 待办, 话题, 链接."""
    real = [e for e in entries if not is_noise(e.text)]
    speakers = Speakers(e for e in real if not e.from_bot)
    members = speakers.members()
    names = mention_names(speakers)
    lines = [f"{header}{title} · 共 {len(entries)} 条消息 · {len(members)} 人发言"]
    if note:
        lines.append(note)
    if entries:
        lines.append(f"时间：{_stamp(entries[0].at, zone)} — {_stamp(entries[-1].at, zone)}（{zone.key}）")
    if members:
        ranked = [f"{p.label}{p.alias_note} {p.count} 条" for p in members[:top_members]]
        noise = len(entries) - len(real)
        lines.append("最活跃：" + "；".join(ranked) + (f"（不计 {noise} 条表情、哈哈、+1 之类）" if noise else ""))
    texts = [names_for_mentions(e.text, names) for e in real]

    def quote(i: int, limit: int = 120) -> str:
        entry = real[i]
        return f"[{_stamp(entry.at, zone)}] {speakers.label(entry)}: {clip_keeping_links(one_line(texts[i]), limit)}"

    facts = _facts(real, texts)
    fact_score = [0.0] * len(real)
    for fact in facts:
        fact_score[fact.index] = fact.score
    chosen = _pick([f.index for f in facts], fact_score, texts, fact_count, [])
    by_index = {f.index: f for f in facts}
    decisions = [i for i in chosen if by_index[i].signals.decision]
    todos = [i for i in chosen if not by_index[i].signals.decision]
    if decisions:
        lines.append("结论/决定：")
        lines += [f"- {quote(i)}" for i in decisions]
    if todos:
        lines.append("待办：")
        for i in todos:
            signals, entry = by_index[i].signals, real[i]
            # Who: the people @-ed ("@李四 你负责"), else the speaker ("我来").
            who = "、".join(f"@{m}" for m in signals.mentions) or speakers.of(entry).name
            lines.append(f"- {quote(i)} → 谁：{who}" + (f"；何时：{signals.when}" if signals.when else ""))
    marks = scores(real)
    topics = _pick([i for i in range(len(real)) if marks[i] > 0 and i not in by_index], marks, texts,
                   salient_count, chosen)
    if topics:
        lines.append("话题：")
        lines += [f"- {quote(i, 80)}" for i in topics]
    shared: dict[str, int] = {}
    for i, text in enumerate(texts):
        for link in classify(text).links:
            shared.setdefault(link, i)
    if shared:
        lines.append("链接：")
        shown = list(shared.items())[-link_count:]  # the newest when there are too many
        lines += [f"- {link} （{speakers.label(real[i])}，{_stamp(real[i].at, zone)}）" for link, i in shown]
        if len(shared) > len(shown):
            lines.append(f"（另有 {len(shared) - len(shown)} 个更早的链接未列出）")
    return "\n".join(lines)
