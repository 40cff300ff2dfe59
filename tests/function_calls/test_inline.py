"""Thinking and tool calls written in ``content``: read alike whole or streamed in any pieces, never shown."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from function_calls.inline import ContentReader, read_content

WORDS = st.sampled_from(["好的", "answer", " ", "\n", "<", ">", "/", "<think>", "</think>", "<THINK>", "</Think>",
                         "<thinking>", "</thinking>", "<reasoning>", "</reasoning>", "<tool_call>", "</tool_call>",
                         "<tool", "</th", '{"name": "ping", "arguments": {}}', "{", "8000", "\ud83d"])
CONTENT = st.lists(WORDS, max_size=12).map("".join)


def streamed(content: str, cuts: list[int]) -> tuple[ContentReader, str]:
    reader, shown, last = ContentReader(), [], 0
    for cut in [*sorted(c % (len(content) + 1) for c in cuts), len(content)]:
        shown.append(reader.feed(content[last:cut]))
        last = max(last, cut)
    shown.append(reader.finish())
    return reader, "".join(shown)


def summary(reader: ContentReader) -> tuple[str, str, list[tuple[str, str]]]:
    return reader.text, reader.reasoning, [(c.name, c.arguments) for c in reader.calls]


@settings(max_examples=200, deadline=None)
@given(content=CONTENT, cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8))
def test_any_split_of_a_content_reads_as_the_whole_and_shows_only_its_answer(content: str, cuts: list[int]) -> None:
    reader, shown = streamed(content, cuts)
    assert summary(reader) == summary(read_content(content))
    assert shown == reader.text
    if reader.calls:
        assert reader.text == ""
    if content.lstrip()[:1] not in ("<", ""):  # an answer not opening with a tag is all text
        assert reader.text == content and reader.reasoning == "" and not reader.calls


@settings(max_examples=60, deadline=None)
@given(thought=st.text(max_size=20).filter(lambda t: "</think>" not in t.lower()),
       answer=st.text(min_size=1, max_size=20).filter(lambda t: not t[0].isspace() and not t.startswith("<")),
       lead=st.sampled_from(["", " ", "\n\n"]), cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=6))
def test_a_leading_think_block_is_reasoning_and_the_rest_the_answer(
        thought: str, answer: str, lead: str, cuts: list[int]) -> None:
    reader, shown = streamed(f"{lead}<think>{thought}</think>\n\n{answer}", cuts)
    assert (reader.text, reader.reasoning, shown) == (answer, thought, answer)
    unclosed, shown = streamed(f"{lead}<think>{thought}", cuts)
    assert (unclosed.text, unclosed.reasoning, shown) == ("", thought, "")


def test_tool_call_blocks_are_calls_and_anything_else_makes_them_text() -> None:
    call = '<tool_call>{"name": "weather", "parameters": {"city": "北京"}}</tool_call>'
    reader = read_content(f"<think>查一下</think>\n{call}\n <TOOL_CALL>{{\"name\": \"ping\"}}</Tool_Call>\n")
    assert [(c.name, json.loads(c.arguments)) for c in reader.calls] == [("weather", {"city": "北京"}), ("ping", {})]
    assert reader.text == "" and reader.reasoning == "查一下" and len({c.id for c in reader.calls}) == 2
    assert [(c.name, c.arguments) for c in read_content("<tool_call>[1, 2]</tool_call>").calls] == [("", "[1, 2]")]
    for text in (f"{call} 然后呢", f"好的 {call}", call[:-3]):
        mixed = read_content(text)
        assert mixed.text == text and mixed.calls == []


SPACE = st.sampled_from(["", " ", "\n", "\n\n"])


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.tuples(SPACE, st.sampled_from(["ping", "weather", "天气"]), SPACE), min_size=1, max_size=3),
       tail=SPACE, cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_content_of_only_tool_call_blocks_is_those_calls_never_shown(
        blocks: list[tuple[str, str, str]], tail: str, cuts: list[int]) -> None:
    content = "".join(f'{a}<tool_call>{b}{{"name": "{name}", "arguments": {{}}}}{b}</tool_call>'
                      for a, name, b in blocks) + tail
    reader, shown = streamed(content, cuts)
    assert [c.name for c in reader.calls] == [name for _, name, _ in blocks] and shown == reader.text == ""
