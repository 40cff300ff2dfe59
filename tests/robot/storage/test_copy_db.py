"""``qunbot copy-db``: an owner who outgrows SQLite moves to PostgreSQL and loses nothing: history,
reminders, memories, the outbox; a second copy into the same database is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import memory
import reminders
from robot import maintenance
from robot.bot import Bot
from robot.cli import main
from robot.config import Settings
from robot.message import ChatRef
from robot.testing import MemoryChannel

G1 = ChatRef(platform="memory", chat_id="g1", kind="group")


def settings_for(data_dir: Path, url: str = "") -> Settings:
    return Settings(bot={"data_dir": data_dir, "plugins": ["reminders", "memory"], "timezone": "Asia/Shanghai"},
                    storage={"url": url}, limits={"user_burst": 1000, "chat_burst": 1000})


async def ask(ch: MemoryChannel, text: str, **kw: Any) -> str:
    before = len(ch.sent)
    await ch.inject(text, **kw)
    return (await ch.wait_sent(before + 1, timeout=10))[before].text


async def running(settings: Settings, ch: MemoryChannel) -> Bot:
    bot = Bot(settings, channels=[ch], plugins=[reminders.plugin, memory.plugin])
    await bot.start()
    return bot


async def test_a_sqlite_bot_moves_to_postgresql_with_everything_it_kept(tmp_path: Path, pg_url: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    ch = MemoryChannel()
    bot = await running(settings_for(data), ch)
    try:
        assert "记住了" in await ask(ch, "/remember 我对花生过敏")
        assert "每天 08:00" in await ask(ch, "/remind 每天 8:00 喝水")
        await ch.inject("周五团建去爬山", user="u2")
        ch.down = True  # a reply that could not go out yet: it waits in the outbox
        await ch.inject("/help", user="u3")
        assert await bot.outbox.pending() == 1
        assert await maintenance.copy_db(settings_for(data), pg_url) == 2  # while it runs: refused
        assert "a bot is running on" in capsys.readouterr().err
    finally:
        await bot.stop(flush_timeout_s=0.1)

    copy_sync, refused = maintenance.copy_sync, []

    def a_bot_starts_meanwhile(tx: Any, source: str) -> Any:  # (it wrote rows the copy had passed)
        from robot.storage import StorageError
        from robot.storage.lockfile import sole_process

        try:
            with sole_process(Path(source)):
                pass
        except StorageError:
            refused.append(source)
        return copy_sync(tx, source)

    maintenance.copy_sync = a_bot_starts_meanwhile  # type: ignore[assignment]
    try:
        assert await maintenance.copy_db(settings_for(data), pg_url) == 0
    finally:
        maintenance.copy_sync = copy_sync  # type: ignore[assignment]
    assert refused  # the copy holds the file as a running bot does
    out = capsys.readouterr().out
    assert "rows of" in out and "memory_lexicon" in out and "secret.key" in out

    ch2 = MemoryChannel()
    ch2._ids = iter(range(1000, 2000))  # the platform's message ids go on; they are not reused
    bot = await running(settings_for(data, pg_url), ch2)
    try:
        await ch2.wait_sent(1, timeout=10)  # the reply that waited goes out from the PostgreSQL bot
        assert ch2.sent[0].text.startswith("可用命令") or "/remind" in ch2.sent[0].text
        assert "花生过敏" in await ask(ch2, "/recall 过敏")  # the lexical index was rebuilt at start
        assert "喝水" in await ask(ch2, "/reminders")
        said = [e.text for e in await bot.history.recent(G1)]
        assert "周五团建去爬山" in said and "/remember 我对花生过敏" in said
        assert "记住了" in await ask(ch2, "/remember 周会改到周四 group")  # new rows after the copied ids
        assert "周会" in await ask(ch2, "/recall 周会")
    finally:
        await bot.stop(flush_timeout_s=0.1)

    # Again into the same database: refused, and what is there is untouched.
    assert await maintenance.copy_db(settings_for(data), pg_url) == 2
    assert "already holds data" in capsys.readouterr().err


def test_copy_db_refuses_what_it_cannot_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "qunbot.toml"
    config.write_text(f'[bot]\ndata_dir = "{tmp_path / "data"}"\n', encoding="utf-8")
    assert main(["copy-db", "--config", str(config), "--to", "sqlite:///elsewhere.sqlite3"]) == 2
    assert "--to must be a postgresql://" in capsys.readouterr().err
    assert main(["copy-db", "--config", str(config), "--to", "postgresql://u:hunter2@127.0.0.1:1/x"]) == 2
    err = capsys.readouterr().err
    assert "no database at" in err and "hunter2" not in err
