"""CQ codes, segments, event conversion and settings of the OneBot v11 channel (no sockets)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError

import robot.channels.onebot as onebot
from robot.channels.onebot import (
    CQCodeError,
    OneBotSettings,
    Segment,
    at_targets,
    compose_message,
    escape,
    message_from_event,
    parse_cq,
    parse_message,
    plain_text,
    reply_id,
    to_array,
    to_cq,
    unescape,
)
from robot.channels.onebot import channel as channel_mod
from robot.channels.onebot import connection as connection_mod
from robot.channels.onebot import cq as cq_mod
from robot.channels.onebot import events as events_mod
from robot.channels.onebot import presence as presence_mod
from robot.channels.onebot import settings as settings_mod
from robot.channels.onebot import testing as testing_mod

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[3] / "vectors" / "onebot_v11.json").read_text("utf-8")
)
EVENTS: dict[str, dict[str, Any]] = VECTORS["events"]


@pytest.mark.parametrize(
    "text",
    ["plain", "a & b", "[CQ:at,qq=1]", "x,y", "&#91;literal&#93;", "&amp;", "混合 [中文], & 符号", ""],
)
def test_escape_roundtrip(text: str) -> None:
    assert unescape(escape(text)) == text
    assert unescape(escape(text, escape_comma=False)) == text


def test_escape_uses_onebot_entities() -> None:
    assert escape("a&b[c]d,e") == "a&amp;b&#91;c&#93;d&#44;e"
    assert escape("a,b", escape_comma=False) == "a,b"


def test_cq_roundtrip_with_params_containing_commas_and_brackets() -> None:
    segments = [
        Segment.text_segment("see [this], & that "),
        Segment("share", {"url": "https://a.example/?x=1,2&y=[3]", "title": "a,b=c"}),
        Segment.at("20002"),
        Segment.text_segment(" end"),
    ]
    rendered = to_cq(segments)
    assert rendered == (
        "see &#91;this&#93;, &amp; that "
        "[CQ:share,url=https://a.example/?x=1&#44;2&amp;y=&#91;3&#93;,title=a&#44;b=c]"
        "[CQ:at,qq=20002] end"
    )
    assert parse_cq(rendered) == segments


def test_parse_cq_string_vector() -> None:
    segments = parse_message(EVENTS["group_message_string_format"]["message"])
    assert segments == [Segment.at("10001"), Segment.text_segment(" 总结一下 & 谢谢")]


_NAME = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def reference_parse(message: str) -> list[Segment]:
    """A plain linear scanner for the CQ grammar: ``[CQ:`` name, optional ``,params``, ``]``, nothing
    inside being a bracket (a conformant sender escapes them); everything else is text."""
    segments: list[Segment] = []
    text: list[str] = []
    i = 0
    while i < len(message):
        if message.startswith("[CQ:", i):
            following = message.find("[", i + 1)
            stop = len(message) if following == -1 else following
            end = message.find("]", i, stop)  # (bounded by the next "[": linear overall)
            name, comma, params = message[i + 4 : end].partition(",")
            if end != -1 and name and set(name) <= _NAME:
                if text:
                    segments.append(Segment.text_segment(unescape("".join(text))))
                data: dict[str, object] = {}
                for param in params.split(",") if comma else []:
                    key, sep, value = param.partition("=")
                    if key:
                        data[key] = unescape(value) if sep else ""
                segments.append(Segment(name, data))
                text, i = [], end + 1
                continue
        text.append(message[i])
        i += 1
    if text:
        segments.append(Segment.text_segment(unescape("".join(text))))
    return segments


_PIECES = st.sampled_from(["[CQ:at,", "[CQ:", "at", "qq=1", ",", "=", "]", "[", "&#91;", "&amp;", "x", "中"])


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(_PIECES, max_size=24))
def test_parse_cq_agrees_with_a_linear_scanner(pieces: list[str]) -> None:
    message = "".join(pieces)
    assert parse_cq(message) == reference_parse(message)


_VALUES = st.text(st.sampled_from(list("ab,=[]&#;9 中")), max_size=8)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.tuples(st.text(min_size=1, max_size=6), st.sampled_from(["at", "image", "reply"]),
                                st.dictionaries(st.sampled_from(["qq", "file", "id"]), _VALUES, max_size=3)),
                      max_size=4))
def test_every_rendered_cq_code_parses_back(items: list[tuple[str, str, dict[str, str]]]) -> None:
    segments = [seg for text, kind, data in items for seg in (Segment.text_segment(text), Segment(kind, dict(data)))]
    assert parse_cq(to_cq(segments)) == segments


@pytest.mark.parametrize("tail", ["", "[CQ:at,qq=20002] 在吗"])
def test_unclosed_cq_heads_are_text_and_a_code_after_them_still_parses(tail: str) -> None:
    """A sender's unescaped "[CQ:x," heads, by the thousand: each is text (and a scan from each to the
    end of the message, quadratic, froze the bot for seconds); a real code after them is kept."""
    message = "[CQ:at,qq=1" * 4000 + tail
    segments = parse_cq(message)
    assert segments == reference_parse(message)
    assert segments[0] == Segment.text_segment("[CQ:at,qq=1" * 4000)
    assert at_targets(segments) == (["20002"] if tail else [])


def test_parse_array_normalises_numeric_ids_to_strings() -> None:
    segments = parse_message([{"type": "at", "data": {"qq": 10001}}, {"type": "reply", "data": {"id": 77}}])
    assert at_targets(segments) == ["10001"]
    assert reply_id(segments) == "77"


def test_parse_message_accepts_a_single_segment_object_and_missing_data() -> None:
    assert parse_message({"type": "text", "data": {"text": "hi"}}) == [Segment.text_segment("hi")]
    assert parse_message([{"type": "shake"}]) == [Segment("shake", {})]


@pytest.mark.parametrize("bad", [42, None, [1], [{"data": {}}], [{"type": "at", "data": "qq=1"}]])
def test_parse_message_rejects_garbage(bad: object) -> None:
    with pytest.raises(CQCodeError):
        parse_message(bad)


def test_plain_text_and_at_helpers() -> None:
    segments = parse_cq(
        "[CQ:reply,id=5][CQ:at,qq=10001] 提醒 [CQ:at,qq=20003] 和 [CQ:at,qq=all][CQ:face,id=1]!"
    )
    assert plain_text(segments) == " 提醒  和 !"
    assert plain_text(segments, strip_at={"10001"}) == " 提醒 @20003 和 @全体成员!"
    assert at_targets(segments) == ["10001", "20003", "all"]
    assert reply_id(segments) == "5"
    assert reply_id(parse_cq("no reply")) is None


def test_compose_message_matches_the_vector_action_call() -> None:
    segments = compose_message("已为你设置提醒", mentions=["20002"])
    assert to_array(segments) == VECTORS["action_call"]["params"]["message"]
    assert to_array(compose_message("hi", reply_to="9")) == [
        {"type": "reply", "data": {"id": "9"}},
        {"type": "text", "data": {"text": "hi"}},
    ]


def test_message_from_event_mentions_and_ids_as_strings() -> None:
    event = {**EVENTS["group_message_at_bot"], "self_id": "10001", "group_id": "123456", "user_id": "20002"}
    message = message_from_event(event)
    assert message is not None
    assert message.chat.key == "onebot:group:123456"
    assert message.sender.user_id == "20002"
    assert message.mentions_bot is True
    assert message.text == "提醒我明天早上8点交周报"


def test_message_from_event_at_all_is_not_a_mention_of_the_bot() -> None:
    event = {**EVENTS["group_message_plain"], "message": "[CQ:at,qq=all] 开会了"}
    message = message_from_event(event)
    assert message is not None
    assert message.mentions_bot is False
    assert message.mentions == ()
    assert message.text == "@全体成员 开会了"


def test_an_at_of_a_sibling_account_is_for_that_account() -> None:
    """Account 10002 sees a member @ account 10001 (the bot's too): an @ of the bot, to answer as 10001."""
    event = {**EVENTS["group_message_at_bot"], "self_id": 10002}
    assert message_from_event(event).mentions_bot is False  # type: ignore[union-attr]
    message = message_from_event(event, own={"10001", "10002"})
    assert message is not None and message.mentions_bot is True
    assert (message.chat.account, message.text) == ("10001", "提醒我明天早上8点交周报")
    both = {**event, "message": "[CQ:at,qq=10001][CQ:at,qq=10002] 在吗"}  # (each copy answers as itself)
    assert message_from_event(both, own={"10001", "10002"}).chat.account == "10002"  # type: ignore[union-attr]


def test_message_from_event_ignores_own_and_non_chat_events() -> None:
    assert message_from_event({**EVENTS["group_message_plain"], "user_id": 10001}) is None
    assert message_from_event({**EVENTS["group_message_plain"], "message_type": "guild"}) is None


def test_message_from_event_millisecond_time_and_missing_fields() -> None:
    message = message_from_event({**EVENTS["private_message"], "time": 1732166412000})
    assert message is not None
    assert message.timestamp == datetime(2024, 11, 21, 5, 20, 12, tzinfo=UTC)
    with pytest.raises(ValueError):
        message_from_event({k: v for k, v in EVENTS["group_message_plain"].items() if k != "group_id"})


def test_settings_defaults_and_validation() -> None:
    settings = OneBotSettings(access_token=SecretStr("tok-123"), path="onebot/v11/ws/")
    assert settings.mode == "reverse"
    assert settings.path == "/onebot/v11/ws"
    assert settings.token == "tok-123"
    assert "tok-123" not in repr(settings)
    assert OneBotSettings(access_token=SecretStr("")).access_token is None
    with pytest.raises(ValidationError):
        OneBotSettings(mode="forward")
    with pytest.raises(ValidationError):
        OneBotSettings(mode="forward", url="http://127.0.0.1:3001")
    with pytest.raises(ValidationError):
        OneBotSettings(prot=8080)  # type: ignore[call-arg]


def test_package_exports_are_complete() -> None:
    modules = [channel_mod, connection_mod, cq_mod, events_mod, presence_mod, settings_mod, testing_mod]
    exported: set[str] = set()
    for module in modules:
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
        exported.update(module.__all__)
    assert set(onebot.__all__) == exported
    assert {"OneBotChannel", "OneBotSettings", "OneBotTestPeer"} <= set(onebot.__all__)
