"""The shared "typing…" indicator: counted runs, paused around sends, a safety net, failures kept quiet."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from robot.channels.typing_indicator import TypingIndicators

KEY = "telegram:group:-1"


class Platform:
    """Records what the indicator asked of the platform, in order."""

    def __init__(self, *, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.while_clearing: Callable[[], Awaitable[None]] | None = None

    async def show(self) -> bool:
        self.calls.append("show")
        if self.fail:
            raise OSError("refused")
        return True

    async def clear(self) -> None:
        self.calls.append("clear")
        if self.while_clearing is not None:
            await self.while_clearing()


def start(typing: TypingIndicators, platform: Platform, max_s: float = 60.0) -> None:
    typing.begin(KEY, platform.show, platform.clear, every=0.05, max_s=max_s)


async def test_a_run_started_during_a_send_is_shown_after_the_message() -> None:
    typing, platform = TypingIndicators("test"), Platform()
    async with typing.paused(KEY):
        start(typing, platform)  # its first action reaches the chat before the message, which clears it
        await asyncio.sleep(0)
        platform.calls.append("send")
    await asyncio.sleep(0.01)
    assert platform.calls[platform.calls.index("send"):][:3] == ["send", "clear", "show"]
    await typing.end(KEY)
    assert platform.calls[-1] == "clear"


async def test_a_run_ending_while_a_send_restarts_it_leaves_it_off() -> None:
    typing, platform = TypingIndicators("test"), Platform()
    async with typing.paused(KEY):
        start(typing, platform)
        await asyncio.sleep(0.01)
        platform.while_clearing = lambda: typing.end(KEY)  # the run ends while the send takes it down
    await asyncio.sleep(0.15)
    assert platform.calls[-1] == "clear"


async def test_the_safety_net_stops_it_and_forgets_the_count() -> None:
    typing, platform = TypingIndicators("test"), Platform()
    start(typing, platform, max_s=0.1)
    start(typing, platform, max_s=0.1)  # two runs whose ends never come
    await asyncio.sleep(0.2)
    assert platform.calls[-1] == "clear"
    shown = len(platform.calls)
    async with typing.paused(KEY):  # a later reply does not bring it back
        pass
    await asyncio.sleep(0.1)
    assert len(platform.calls) == shown
    start(typing, platform)
    await typing.end(KEY)  # one end for the one run counted now
    assert platform.calls[-2:] == ["show", "clear"]


async def test_a_refused_indicator_is_quiet_and_close_stops_the_rest() -> None:
    typing, refused, fine = TypingIndicators("test"), Platform(fail=True), Platform()
    start(typing, refused)
    typing.begin("other", fine.show, fine.clear, every=0.05, max_s=60.0)
    await asyncio.sleep(0.12)
    assert refused.calls == ["show"]  # not retried every refresh, nothing to clear
    await typing.close()
    assert fine.calls[-1] == "clear" and fine.calls.count("show") >= 2
    await typing.end("other")  # an end after close() is harmless
