"""The rig of ``bench_faults.py``: the OneBot peer it drives and the bot process it kills."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
ZONES = ("Asia/Shanghai", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Adelaide",
         "America/St_Johns")
SELF_ID = 10001
STUCK_GROUP = 799999
FIRST_GROUP = 700001
REMINDER = re.compile(r"⏰ 提醒：fb(\d+)")
CONFIRMED = re.compile(r"已设置提醒.*内容：fb(\d+)", re.S)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> str:
    if not values:
        return "n=0"
    return (f"n={len(values)} p50 {pct(values, 0.5) * 1000:.0f} ms, p99 {pct(values, 0.99) * 1000:.0f} ms, "
            f"max {max(values) * 1000:.0f} ms")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Planned:
    index: int
    group: int
    due: float  # epoch seconds
    key: str  # the outbox key the engine gives its message ("" for one typed as /remind)
    typed: float | None = None  # when the /remind command was sent


@dataclass
class Arrival:
    at: float
    group: int
    index: int | None
    acked: bool


@dataclass
class Window:
    kind: str  # "start", "kill", "timed kill", "outage"
    start: float
    end: float = 0.0  # the peer's next connection
    held: int = 0  # timed kill: sends received but unacknowledged at the kill


@dataclass
class Peer:
    """A OneBot v11 implementation that dials the bot (reverse mode) and records every send."""

    url: str
    token: str
    arrivals: list[Arrival] = field(default_factory=list)
    connects: list[float] = field(default_factory=list)
    allowed: bool = True  # False during an outage
    hold: bool = False  # withhold acknowledgements (a timed kill is coming)
    held: int = 0
    first_held: asyncio.Event = field(default_factory=asyncio.Event)
    faulting: bool = False  # a fault is under way: no /remind is typed now
    confirmations: dict[int, float] = field(default_factory=dict)  # live reminder -> its reply's arrival
    ws: aiohttp.ClientWebSocketResponse | None = None
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    next_message_id: int = 5000

    async def run(self, stop: asyncio.Event) -> None:
        headers = {"X-Self-ID": str(SELF_ID), "X-Client-Role": "Universal", "Authorization": f"Bearer {self.token}"}
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                if not self.allowed:
                    await asyncio.sleep(0.02)
                    continue
                try:
                    ws = await session.ws_connect(self.url, headers=headers, timeout=aiohttp.ClientWSTimeout(ws_close=1))
                except (TimeoutError, aiohttp.ClientError, OSError):
                    await asyncio.sleep(0.05)  # the bot is (re)starting: dial again soon
                    continue
                self.ws = ws
                self.connects.append(time.time())
                self.connected.set()
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await ws.send_str(json.dumps({"time": int(time.time()), "self_id": SELF_ID,
                                                  "post_type": "meta_event", "meta_event_type": "lifecycle",
                                                  "sub_type": "connect"}))
                    await self._read(ws)
                self.ws = None
                self.connected.clear()
                with contextlib.suppress(Exception):
                    await ws.close()

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            try:
                frame = json.loads(msg.data)
            except ValueError:
                continue
            if not isinstance(frame, dict) or "action" not in frame:
                continue
            action, params, echo = frame["action"], frame.get("params") or {}, frame.get("echo")
            answer: dict[str, Any] | None
            if action in ("send_group_msg", "send_msg", "send_private_msg"):
                group = int(params.get("group_id") or 0)
                text = "".join(str(s.get("data", {}).get("text", "")) for s in params.get("message") or []
                               if isinstance(s, dict) and s.get("type") == "text")
                found = REMINDER.search(text)
                confirmed = CONFIRMED.search(text)
                if confirmed and not found:
                    self.confirmations.setdefault(int(confirmed.group(1)), time.time())
                stuck = group == STUCK_GROUP
                withhold = stuck or self.hold
                if found or not confirmed:
                    self.arrivals.append(Arrival(time.time(), group, int(found.group(1)) if found else None,
                                                 not withhold))
                if self.hold and not stuck:
                    self.held += 1
                    self.first_held.set()
                if withhold:
                    continue
                answer = {"status": "ok", "retcode": 0, "data": {"message_id": self.next_message_id}, "echo": echo}
                self.next_message_id += 1
            elif action == "get_login_info":
                answer = {"status": "ok", "retcode": 0, "data": {"user_id": SELF_ID, "nickname": "qunbot"},
                          "echo": echo}
            else:
                answer = {"status": "failed", "retcode": 1404, "data": None, "echo": echo}
            await ws.send_str(json.dumps(answer))

    async def send_event(self, event: dict[str, Any]) -> bool:
        ws = self.ws
        if ws is None or ws.closed:
            return False
        try:
            await ws.send_str(json.dumps(event, ensure_ascii=False))
        except (ConnectionError, RuntimeError):
            return False
        return True

    async def drop(self) -> None:
        ws = self.ws
        if ws is not None:
            await ws.close()


class BotProcess:
    """``python -m robot.cli run`` as a child process; its output goes to ``bot.log``."""

    def __init__(self, config: Path, log: TextIO) -> None:
        self.config, self.log = config, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.killed = False  # between our SIGKILL and the restart: not an exit by itself
        self.unexpected_exits: list[int] = []

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUNBOT_")}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, "-m", "robot.cli", "run", "--config", str(self.config)],
                                     cwd=self.config.parent, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.starts += 1
        self.killed = False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.killed = True
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def check(self) -> None:
        """Restart a bot that exited by itself (recorded: that is a finding, not a fault we made)."""
        if self.proc is not None and not self.killed and self.proc.poll() is not None:
            self.unexpected_exits.append(self.proc.returncode)
            self.start()

    def stop(self, timeout: float) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            return None
