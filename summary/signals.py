"""What a chat message carries, read without a model: noise, decisions, action items, dates, links.

* :func:`is_noise`: stickers and media placeholders (``[动画表情]``), laughter (哈哈, 233, lol),
  ``+1``/``666``/``👍`` and one-character replies. Noise is neither counted as activity nor
  quoted, nor sent to the model.
* :func:`classify`: a message's :class:`Signals`: a decision (结论/决定/定了/推迟到/改到 ..., not
  after a negation: 还不确定, 还没决定), an action item (a commitment such as "我来" or "@X 你负责",
  a deadline), the date or time it names, the people it @-mentions and the links it holds (whole,
  never cut).
* :func:`clip_keeping_links`: shortens text without ever cutting inside a URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "LINK",
    "Signals",
    "classify",
    "clip_keeping_links",
    "is_noise",
    "links",
    "names_for_mentions",
    "weekday",
]

LINK = re.compile(r"(?:https?://|www\.)[^\x00-\x20\x7f-\U0010ffff<>\"']+",
                  re.IGNORECASE | re.ASCII)  # (ASCII: no "ſ" folding to "s" in the range)
"""A link as WeChat and QQ make it clickable: it ends at a space or the first non-ASCII character (a
Chinese word or punctuation typed right after it); a percent-encoded link is ASCII, whole."""
_PLACEHOLDER = re.compile(r"\[(?:[^\[\]]{1,8})\]")  # [动画表情] [图片] [Sticker] [捂脸]
_EMOJI = re.compile("[\U0001f000-\U0001faff\u2600-\u27bf\ufe0f\u200d]")
_LAUGH = re.compile(r"^(?:[哈呵嘿嘻嘎h]+|2333*|lol+|lmao|xswl|笑死(?:我了)?|草+|hhh+)$", re.IGNORECASE)
_ACK_NOISE = re.compile(r"^(?:\+\d|[+＋]1+|1+|6+|赞+|顶+|good|nice|ok|okk+|[?？!！.。~～]+)$", re.IGNORECASE)
_PUNCT = re.compile(r"[\s\W_]+")

_DECISION = re.compile(
    r"结论|决定|决议|定了|定下|敲定|确定(?!吗|不)|就这么定|最终|拍板|通过了|批准|同意了|取消|推迟|延期|提前到|"
    r"改到|改成|改为|改期|换到|定在|定为|统一用|以后都|从今天起|截止|deadline|ddl",
    re.IGNORECASE,
)
# A deciding word after a negation or a wait is undecided ("还不确定", "还没决定", "等老板拍板"); a change
# word is not ("不推迟了" decides), nor a negation after the word ("决定不去了") or further back ("不错，定了").
_DECIDING = re.compile(r"结论|决|定|拍板|通过|批准|同意")
_UNDECIDED = re.compile(r"(?:(?:不|没|未|待)(?:有|太|能|会|好|曾)?|等\w{0,4})$")
_COMMIT = re.compile(r"我来|我负责|我去(?:订|买|办|联系|问|拿|约|写|做|处理|搞)|我(?:明天|今晚|下午|周.)?(?:会)?(?:提交|交|发|写|订|买|整理|跟进)|"
                     r"交给我|包在我身上|我认领|我报名")
_ASSIGN = re.compile(r"@\S+\s*(?:你|您)?(?:负责|来|跟进|处理|准备|整理|提交|记得|帮忙)|(?:负责人|由)\s*[:：]?\s*@?\S{1,12}\s*(?:负责|来)|"
                     r"待办|TODO|todo|action item|记得|别忘了|务必|报名")
_WHEN = re.compile(
    r"(?:\d{4}[-/年])?\d{1,2}[-/月]\d{1,2}[日号]?|"
    r"(?:今天|明天|后天|今晚|明晚|本周|这周|下周|下下周|周末|月底|月初|年底)[一二三四五六日天]?|"
    r"(?:周|星期|礼拜)[一二三四五六日天]|"
    r"(?:上午|下午|晚上|中午|早上)?\s*\d{1,2}(?:[:：]\d{2}|点半?|点\d{1,2}分?)|"
    r"\d+\s*(?:天|小时|分钟)(?:内|后|之内)|"
    r"(?:之前|以前|前)(?=交|提交|完成|发)"
)
_MENTION = re.compile(r"@([^\s@，,。:：]{1,32})")
_WEEKDAYS = "一二三四五六日"


def weekday(index: int) -> str:
    """``周一`` ... ``周日`` for ``datetime.weekday()``."""
    return "周" + _WEEKDAYS[index]


@dataclass
class Signals:
    """What one message says, by keyword: see the module docstring."""

    decision: bool = False
    action: bool = False
    when: str | None = None
    mentions: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    number: bool = False

    @property
    def fact(self) -> bool:
        """A decision or an action item: what a summary must not lose."""
        return self.decision or self.action


def _core(text: str) -> str:
    text = _PLACEHOLDER.sub("", text)
    text = _EMOJI.sub("", text)
    return _PUNCT.sub("", text)


def is_noise(text: str) -> bool:
    """A sticker, a placeholder, laughter, ``+1`` and the like, or a one-character reply."""
    stripped = text.strip()
    if not stripped:
        return True
    if LINK.search(stripped):
        return False
    if _ACK_NOISE.match(stripped.replace(" ", "")):
        return True
    core = _core(stripped)
    return len(core) <= 1 or bool(_LAUGH.match(core))


def links(text: str) -> list[str]:
    """The links in ``text``, whole, in order, without duplicates."""
    return list(dict.fromkeys(m.group(0).rstrip(".,)") for m in LINK.finditer(text)))


def _decides(text: str) -> bool:
    return any(not (_DECIDING.search(m.group(0)) and _UNDECIDED.search(text, 0, m.start()))
               for m in _DECISION.finditer(text))


def classify(text: str) -> Signals:
    """The :class:`Signals` of one message; all but its links read from its words (a link's
    "s2/123" is no date, its "@name" no mention)."""
    words = LINK.sub(" ", text)
    when = _WHEN.search(words)
    action = bool(_COMMIT.search(words) or _ASSIGN.search(words))
    # A question proposes; it does not decide ("改到周二？").
    question = words.rstrip().endswith(("?", "？", "吗")) or "怎么办" in words
    return Signals(
        decision=_decides(words) and not question,
        action=action,
        when=when.group(0).strip() if when else None,
        mentions=[m.group(1) for m in _MENTION.finditer(words)],
        links=links(text),
        number=any(ch.isdigit() for ch in words),
    )


def names_for_mentions(text: str, names: dict[str, str]) -> str:
    """``@<user id>`` replaced by ``@<name>`` for the ids in ``names`` (channels store an @ by id
    when they do not know the name); other @s stay as written."""
    if not names or "@" not in text:
        return text
    return _MENTION.sub(lambda m: f"@{names.get(m.group(1), m.group(1))}", text)


def clip_keeping_links(text: str, limit: int, *, ellipsis: str = "…") -> str:
    """``text`` cut to about ``limit`` characters; a link it reaches is kept whole, never cut."""
    if len(text) <= limit:
        return text
    spans = [m.span() for m in LINK.finditer(text)]
    cut = limit - len(ellipsis)
    for start, end in spans:
        if start < cut < end:
            cut = end  # finish the link rather than break it
            break
    if cut >= len(text):
        return text
    head = text[:cut].rstrip()
    # Links after the cut still matter (the 链接 section): they follow the ellipsis.
    tail = [text[s:e] for s, e in spans if s >= cut]
    return head + ellipsis + ("" if not tail else " " + " ".join(tail))
