"""Splitting long texts into parts: fenced code stays code in every part."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from robot.text_parts import split_text

CODE = [line for i in range(30) for line in (f"class Thing{i}:", f"    # keep {i}",
                                              "    def __init__(self, *args, **kwargs):",
                                              f"        self.x = {i}  # __dunder__ stays")]


def test_a_cut_inside_a_fenced_block_closes_it_and_opens_it_again_in_the_next_part() -> None:
    """Part 2 began with bare code: a channel flattening markdown read it as prose."""
    answer = "下面是代码：\n\n```python\n" + "\n".join(CODE) + "\n```\n\n就是这样。"
    parts = split_text(answer, 400)
    assert len(parts) > 3 and all(len(p) <= 400 for p in parts)
    assert parts[0].startswith("下面是代码：\n\n```python\n") and parts[-1].endswith("```\n\n就是这样。")
    for part in parts:
        lines = part.splitlines()
        fences = [line for line in lines if line.startswith("```")]
        assert len(fences) == 2 and fences[0] == "```python" and fences[1] == "```", part
    code = [line for p in parts for line in p.splitlines() if line and not line.startswith("```")]
    assert code == ["下面是代码：", *CODE, "就是这样。"]


def test_a_fence_keeps_its_kind_and_indentation_and_an_unclosed_block_stays_open() -> None:
    body = "\n".join(f"  line {i}" for i in range(60))
    parts = split_text("- 步骤：\n\n  ~~~~sh\n" + body, 200)
    assert all(len(p) <= 200 for p in parts)
    assert all(p.splitlines()[0] == "  ~~~~sh" for p in parts[1:])
    assert all(p.endswith("\n  ~~~~") for p in parts[:-1]) and not parts[-1].endswith("~~~~")


def test_a_block_that_would_start_at_the_end_of_a_part_moves_to_the_next() -> None:
    prose = "说明。" * 40
    parts = split_text(prose + "\n```\n" + "x = 1\n" * 40 + "```", 130)
    assert not any(p.rstrip().endswith("```\n```") or p.strip() == "```\n```" for p in parts)
    assert all(len(p) <= 130 for p in parts)


def test_the_end_of_a_block_at_a_cut_leaves_no_empty_block_behind() -> None:
    code = "\n".join(f"v{i} = {i}" for i in range(20))
    text = f"```\n{code}\n```\n\n后记。"
    for limit in range(60, 200, 7):
        parts = split_text(text, limit)
        assert all(len(p) <= limit for p in parts)
        assert not any("```\n```" in p for p in parts), (limit, parts)
        assert [line for p in parts for line in p.splitlines() if line and line != "```"] == [
            *code.splitlines(), "后记。"]


def test_a_limit_too_small_for_the_fence_lines_cuts_the_block_as_text() -> None:
    text = "```python\n" + "ab\n" * 20 + "```"
    parts = split_text(text, 12)
    assert all(len(p) <= 12 for p in parts)
    assert "".join(p.replace("\n", "") for p in parts) == text.replace("\n", "")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["文字。", "```py", "```", "~~~", "  ```js", "````", "    x = 1", "", "a, b", "长" * 30]),
                max_size=60),
       st.integers(40, 300))
def test_any_markdown_is_split_within_the_limit_and_keeps_every_line(lines: list[str], limit: int) -> None:
    text = "\n".join(lines)
    parts = split_text(text, limit)
    assert all(len(p) <= limit for p in parts)
    kept = [line for p in parts for line in p.splitlines()]
    for line in lines:  # every line survives (fence lines are added, and one closing a block at a cut
        # gives way to the one added there), but a long one: a part is filled rather than cut at a line break
        # in its first half (as before fences were kept), so such a line may be cut
        if line.strip() and not line.startswith(("```", "~~~")) and len(line) <= limit // 2:
            assert line in kept
