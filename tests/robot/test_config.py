"""Configuration: where the file is found, environment overrides, plugin tables, clear errors, secrets."""

from __future__ import annotations

from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel, ConfigDict, SecretStr

from robot.config import ConfigError, Settings
from robot.config_file import load_settings

SECRET = "sk-test-VERY-SECRET-0042"


class SearchSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_key: SecretStr | None = None
    timeout_s: float = 10.0
    engine: str = "sonar"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- where the file comes from -------------------------------------------------------------------

def test_defaults_without_any_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings, source = load_settings()
    assert source is None
    assert settings.bot.name == "qunbot" and settings.llm.model is None and not settings.llm.configured
    assert settings.zone == ZoneInfo("Asia/Shanghai")
    assert settings.bot.plugins == ["reminders", "search", "summary", "memory", "tiers"]


def test_file_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "qunbot.toml", '[bot]\nname = "cwd"\n')
    via_env = write(tmp_path / "env.toml", '[bot]\nname = "env"\n')
    explicit = write(tmp_path / "flag.toml", '[bot]\nname = "flag"\n')
    assert load_settings()[0].bot.name == "cwd"
    monkeypatch.setenv("QUNBOT_CONFIG", str(via_env))
    settings, source = load_settings()
    assert settings.bot.name == "env" and source == via_env
    assert load_settings(explicit)[0].bot.name == "flag"


def test_a_missing_config_file_is_an_error_not_defaults(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


# --- environment -------------------------------------------------------------------------------

def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(tmp_path / "q.toml", '[llm]\nmodel = "from-file"\nbase_url = "http://127.0.0.1:1/v1"\n'
                                     '[limits]\nuser_burst = 3\n')
    monkeypatch.setenv("QUNBOT_LLM__MODEL", "from-env")
    monkeypatch.setenv("QUNBOT_LIMITS__USER_BURST", "7")
    monkeypatch.setenv("QUNBOT_BOT__ADMINS", '["onebot:1"]')
    settings, _ = load_settings(cfg)
    assert settings.llm.model == "from-env" and settings.llm.base_url == "http://127.0.0.1:1/v1"
    assert settings.limits.user_burst == 7 and settings.bot.admins == ["onebot:1"]


def test_openai_variables_are_fallbacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    settings, _ = load_settings(write(tmp_path / "q.toml", '[llm]\nmodel = "m"\n'))
    assert settings.llm.api_key is not None and settings.llm.api_key.get_secret_value() == SECRET
    assert settings.llm.base_url == "http://127.0.0.1:9/v1" and settings.llm.configured
    own, _ = load_settings(write(tmp_path / "q2.toml", '[llm]\napi_key = "sk-own"\nbase_url = "http://own/v1"\n'))
    assert own.llm.api_key is not None and own.llm.api_key.get_secret_value() == "sk-own"
    assert own.llm.base_url == "http://own/v1"


@pytest.mark.parametrize("url", ["http://admin:Pa55#word@127.0.0.1/v1", "http://127.0.0.1:11434x/v1"])
def test_a_fallback_url_with_a_bad_port_is_refused_by_name_and_shows_no_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    # Copied in unchecked, it failed at start in a traceback quoting "Invalid port: 'Pa55'"; an
    # OPENAI_API_KEY with a newline inside was reported as "连接不上".
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ab\ncd")
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path / "q.toml", '[llm]\nmodel = "m"\n'))
    shown = str(caught.value)
    assert "OPENAI_BASE_URL: has a port that is not a number" in shown and "OPENAI_API_KEY: contains" in shown
    assert "Pa55" not in shown and "sk-ab" not in shown


def test_the_embedding_and_search_urls_are_checked_like_the_models() -> None:
    from memory.settings import MemorySettings
    from search.settings import SearchSettings as PerplexitySettings

    with pytest.raises(ValueError, match="port that is not a number"):
        MemorySettings(embedding_base_url="http://admin:Pa55#word@127.0.0.1/v1")
    with pytest.raises(ValueError, match="port that is not a number"):
        PerplexitySettings(base_url="http://127.0.0.1:11434x")


# --- plugin tables ------------------------------------------------------------------------------

def test_plugin_sections_validate_with_env_overrides_and_fallbacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, _ = load_settings(write(tmp_path / "q.toml", '[search]\nengine = "pro"\ntimeout_s = 3\n'))
    monkeypatch.setenv("QUNBOT_SEARCH__TIMEOUT_S", "4.5")
    monkeypatch.setenv("PERPLEXITY_API_KEY", SECRET)
    section = settings.section("search", SearchSettings)
    assert (section.engine, section.timeout_s) == ("pro", 4.5)
    assert section.api_key is not None and section.api_key.get_secret_value() == SECRET
    assert settings.section("absent", SearchSettings) == SearchSettings()


def test_a_bad_plugin_value_names_the_table_and_key(tmp_path: Path) -> None:
    settings, _ = load_settings(write(tmp_path / "q.toml", f'[search]\napi_key = "{SECRET}"\ntimeout_s = "slow"\n'
                                                        'colour = "red"\n'))
    with pytest.raises(ConfigError) as err:
        settings.section("search", SearchSettings)
    message = str(err.value)
    assert "[search] timeout_s" in message and "valid number" in message
    assert "[search] colour" in message and "Extra inputs" in message
    assert SECRET not in message and SECRET not in repr(err.value)


# --- bad files and values ----------------------------------------------------------------------

@pytest.mark.parametrize(("toml", "needles"), [
    ("[llm\nmodel = 1\n", ["not valid TOML", "line 1"]),
    ('[bot]\ntimezone = "Mars/Olympus"\n', ["bot.timezone", "unknown IANA time zone"]),
    ('[bot]\ntimezone = "Asia"\n', ["bot.timezone", "unknown IANA time zone 'Asia'"]),  # a folder of zones
    ('[bot]\nzones = {"onebot:1" = "Europe"}\n', ["bot.zones", "unknown IANA time zone 'Europe'"]),
    ('[limits]\nuser_burst = "lots"\n', ["limits.user_burst", "valid integer"]),
    ('[llm]\nmodle = "gpt"\n', ["llm.modle", "Extra inputs are not permitted"]),
    ('[bot]\nadmins = ["10001"]\n', ["bot.admins", "platform-qualified"]),
    # each loaded and never matched anyone: a space, an upper-case platform
    ('[bot]\nadmins = ["onebot: 10001"]\n', ["bot.admins", "'onebot: 10001'", "space"]),
    ('[bot]\nadmins = ["onebot:1", " web:admin"]\n', ["bot.admins", "' web:admin'", "space"]),
    ('[bot]\nadmins = ["onebot:10003 "]\n', ["bot.admins", "'onebot:10003 '"]),
    ('[bot]\nadmins = ["OneBot:10002"]\n', ["bot.admins", "'OneBot:10002'", "lower-case"]),
    ('[approvals]\napprovers = ["QQ:10004"]\n', ["approvals.approvers", "'QQ:10004'", "lower-case"]),
    ('[channels.onebot]\nport = 70000\n', ["channels.onebot.port", "less than or equal"]),
    ("debug = true\n", ["unknown key 'debug'"]),
    ('[storage]\nlisten_url = "postgresql://db/q"\n', ["storage", "listen_url is for PostgreSQL"]),  # SQLite
    ('[storage]\nurl = "postgresql://pooler/q"\nlisten_url = "mysql://db/q"\n', ["listen_url is for PostgreSQL"]),
    ('[llm]\nbase_url = "http://localhost:8OOO/v1"\n', ["llm.base_url", "port that is not a number"]),  # not at run
    ('[llm]\nbase_url = "localhost:8000/v1"\n', ["llm.base_url", "http:// or https://"]),
    ('[llm.think]\nmodel = "m"\nbase_url = "http://h:99999/v1"\n', ["llm.think.base_url", "not a number"]),
    # a proxy password with an unencoded "/": Python's message quoted its start as the port ("Ab3")
    ('[llm]\nbase_url = "https://proxyuser:Ab3/SECRETxyz@h/v1"\n', ["llm.base_url", "percent-encoded"]),
    ('[llm]\nmodel = "m"\napi_key = "sk-a b"\n', ["llm.api_key", "whitespace or a control character"]),
    ('[llm.plan]\nmodel = "m"\napi_key = "sk-\\u0007"\n', ["llm.plan.api_key", "control character"]),
    ('[bot]\nplugins = ["reminders", "reminders"]\n', ["bot.plugins", "once each"]),
    ('[bot]\nplugins = [""]\n', ["bot.plugins", "not be empty"]),
    ('[gate]\nnever = ["123456"]\n', ["gate.never", '"platform:group_id"', "'123456'"]),  # it matched nothing
    ('[gate]\nallowlist = ["onebot:1", "QQ群 2"]\n', ["gate.allowlist", "'QQ群 2'"]),
    # the playground has no login: served to other machines, anyone reaching it approved as web:admin
    ('[bot]\nadmins = ["web:admin"]\n[channels.web]\nhost = "0.0.0.0"\n', ["'0.0.0.0'", "web:admin", "127.0.0.1"]),
    ('[approvals]\napprovers = ["web:boss"]\n[channels.web]\nenabled = true\nhost = "192.168.1.5"\n'
     '[channels.console]\nenabled = true\n', ["web:boss", "no login"]),
])
def test_bad_files_and_values_name_the_key_and_the_problem(tmp_path: Path, toml: str, needles: list[str]) -> None:
    path = write(tmp_path / "q.toml", toml)
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    for needle in needles:
        assert needle in str(err.value)
    assert str(path) in str(err.value) and "Ab3" not in str(err.value) and "sk-a" not in str(err.value)


def test_web_approvers_load_with_a_loopback_playground_or_none_served(tmp_path: Path) -> None:
    """Only a playground others can reach refuses web: approvers: on loopback (or not opened) they stay."""
    for toml in ('[bot]\nadmins = ["web:admin"]\n[channels.web]\nhost = "::1"\n',
                 '[bot]\nadmins = ["web:admin"]\n[channels.web]\nhost = "0.0.0.0"\n[channels.console]\nenabled = true\n'):
        assert load_settings(write(tmp_path / "q.toml", toml))[0].bot.admins == ["web:admin"]


def test_admins_on_a_platform_this_build_does_not_know_still_load(tmp_path: Path) -> None:
    """A plugin's own channel may bring its platform: only the shape of the id is checked."""
    settings, _ = load_settings(write(tmp_path / "q.toml", '[bot]\nadmins = ["matrix:@a:example.org"]\n'
                                      '[approvals]\napprovers = ["my-chat_2:u1"]\n'))
    assert settings.bot.admins == ["matrix:@a:example.org"] and settings.approvals.approvers == ["my-chat_2:u1"]


def test_an_api_key_with_a_trailing_newline_or_cr_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It passed, then every request failed as "could not reach the model endpoint" (no field named)."""
    settings, _ = load_settings(write(tmp_path / "q.toml", '[llm]\nmodel = "m"\napi_key = "sk-abc\\r\\n"\n'))
    assert settings.llm.api_key is not None and settings.llm.api_key.get_secret_value() == "sk-abc"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env \r")
    settings, _ = load_settings(write(tmp_path / "e.toml", '[llm]\nmodel = "m"\n'))
    assert settings.llm.api_key is not None and settings.llm.api_key.get_secret_value() == "sk-env"


def test_a_bad_environment_value_is_named_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUNBOT_LLM__TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match=r"llm\.timeout_s"):
        load_settings(write(tmp_path / "q.toml", ""))


def test_a_list_in_the_environment_that_is_not_json_says_how_to_write_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUNBOT_BOT__ADMINS", "onebot:1")
    with pytest.raises(ConfigError, match=r"QUNBOT_BOT__ADMINS: a list or table is written as JSON"):
        load_settings(write(tmp_path / "q.toml", ""))


@pytest.mark.parametrize("off", ['"off"', '"none"', '""'])
def test_a_daily_cap_is_turned_off_with_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, off: str) -> None:
    monkeypatch.setenv("QUNBOT_LIMITS__CHAT_DAILY_TOKENS", "off")
    settings, _ = load_settings(write(tmp_path / "q.toml", f"[limits]\nuser_daily_tokens = {off}\n"))
    assert (settings.limits.user_daily_tokens, settings.limits.chat_daily_tokens) == (None, None)
    with pytest.raises(ConfigError, match="user_daily_tokens"):
        load_settings(write(tmp_path / "q.toml", '[limits]\nuser_daily_tokens = "lots"\n'))


def test_the_tables_init_writes_stay_valid_when_their_plugin_is_taken_out(tmp_path: Path) -> None:
    """``qunbot init`` writes [memory] and [tiers]; taking "memory" out of plugins must not break the file."""
    from robot.bot import Bot

    path = write(tmp_path / "q.toml", '[bot]\nplugins = ["reminders"]\n[memory]\nsleep_time = "03:00"\n'
                                      "[tiers]\n")
    settings, _ = load_settings(path)
    Bot(settings)  # checks the tables against the plugins it loads


# --- secrets -----------------------------------------------------------------------------------

def test_secrets_stay_out_of_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [
        f'[llm]\napi_key = "{SECRET}"\ntimeout_s = "x"\n',  # a bad value next to the key
        f'[llm]\napi_key = ["{SECRET}"]\n',  # the key itself is malformed
        f'[llm]\napi_key = "{SECRET}"\n[llm]\n',  # broken TOML containing the key
    ]
    for i, toml in enumerate(cases):
        with pytest.raises(ConfigError) as err:
            load_settings(write(tmp_path / f"q{i}.toml", toml))
        assert SECRET not in str(err.value) and SECRET not in repr(err.value), toml
    monkeypatch.setenv("QUNBOT_LLM__API_KEY", SECRET)
    monkeypatch.setenv("QUNBOT_LLM__MAX_ITERATIONS", "0")
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path / "env.toml", ""))
    assert "llm.max_iterations" in str(err.value) and SECRET not in str(err.value)


def test_secrets_stay_out_of_reprs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    settings, _ = load_settings(write(tmp_path / "q.toml", f'[search]\napi_key = "{SECRET}-plugin"\n'
                                                        '[channels.onebot]\naccess_token = "tok-SECRET-1"\n'))
    assert settings.llm.api_key is not None
    for shown in (repr(settings), str(settings), repr(settings.llm)):
        assert SECRET not in shown and "tok-SECRET-1" not in shown
    assert "search" in repr(settings)  # the plugin table is still visible, its values are not
    assert settings.section("search", SearchSettings).api_key == SecretStr(f"{SECRET}-plugin")


def test_a_chats_zone_is_found_however_the_owner_wrote_its_key() -> None:
    # "onebot:123456" (the form [gate] takes) matched no chat: reminders fired at Shanghai's hour.
    settings = Settings(bot={"zones": {"onebot:123456": "Europe/Berlin", "onebot:private:10001": "Asia/Tokyo",
                                       "telegram:group:-1005": "Europe/London"}})
    assert settings.zone_for("onebot:group:123456").key == "Europe/Berlin"
    assert settings.zone_for("onebot:private:10001").key == "Asia/Tokyo"
    assert settings.zone_for("onebot:private:123456").key == "Asia/Shanghai"  # a person's chat is not the group
    assert settings.zone_for("telegram:group:-1005").key == "Europe/London"
    with pytest.raises(ValueError, match="onebot:123456"):  # a bare id names no chat: refused, not ignored
        Settings(bot={"zones": {"123456": "Europe/Berlin"}})


def test_a_wecom_bot_user_id_nothing_reads_is_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # qunbot init wrote it and nothing ever read it: old configs still load, and say so.
    settings = Settings(channels={"wecom": {"bot_user_id": "qunbot"}})
    assert "bot_user_id" not in settings.channels.wecom.model_dump()
    assert "bot_user_id does nothing" in caplog.text


def test_loop_stages_out_of_order_are_refused() -> None:
    # loop_breaker=2 under loop_warn=9 stopped a request before the model was ever warned.
    with pytest.raises(ValueError, match="loop_warn"):
        Settings(llm={"loop_warn": 9, "loop_critical": 3, "loop_breaker": 2})
    assert Settings(llm={"loop_warn": 3, "loop_critical": 3, "loop_breaker": 4}).llm.loop_breaker == 4


def test_limits_a_tool_would_override_in_silence_are_refused_at_start() -> None:
    # A plan allowed 600 s was cancelled at its tool's 600 s and never reported: refused with the reason.
    # An embedding allowed 60 s is given up at 20: said in the log (refusing it broke configs that worked).
    from memory.settings import MemorySettings

    with pytest.raises(ValueError, match="reply_within_s"):
        Settings(llm={"plan": {"model": "m", "reply_within_s": 600}})
    assert MemorySettings(embedding_timeout_s=60).embedding_timeout_s == 60  # (valid before: still starts, told)


def test_settings_can_be_built_directly_for_tests(tmp_path: Path) -> None:
    settings = Settings(bot={"data_dir": tmp_path, "timezone": "Europe/Berlin"})
    assert settings.bot.data_dir == tmp_path and settings.zone.key == "Europe/Berlin"


def test_a_variable_naming_no_table_is_refused_with_the_near_miss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from robot.bot import Bot

    monkeypatch.setenv("QUNBOT_LMM__MODEL", "gpt")
    settings, _ = load_settings(write(tmp_path / "q.toml", ""))
    with pytest.raises(ConfigError, match=r"QUNBOT_LMM__MODEL names no table: did you mean \[llm\]\?"):
        Bot(settings, plugins=[])


def test_a_blank_api_key_falls_back_like_a_missing_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    settings, _ = load_settings(write(tmp_path / "q.toml", '[llm]\nmodel = "m"\napi_key = ""\n'))
    assert settings.llm.api_key is not None and settings.llm.api_key.get_secret_value() == SECRET


def test_a_plugins_list_comes_from_the_environment_as_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from search.settings import SearchSettings

    monkeypatch.setenv("QUNBOT_SEARCH__SEARCH_DOMAIN_FILTER", '["example.com", "-pinterest.com"]')
    settings, _ = load_settings(write(tmp_path / "q.toml", ""))
    assert settings.section("search", SearchSettings).search_domain_filter == ["example.com", "-pinterest.com"]


def test_a_frozen_processs_transaction_is_ended_within_half_a_lease(tmp_path: Path) -> None:
    """The others wait on the rows it locked: ended after a whole lease, their own work looked stalled past
    what their leases trust (13.5 s of 15), and healthy processes gave their accounts up."""
    from robot.storage.postgres import PostgresDatabase

    engine = Settings(storage={"url": "postgresql://db/q", "lease_s": 15}).storage.engine(tmp_path)
    assert isinstance(engine, PostgresDatabase) and engine.stall_s == 7.5


def test_a_storage_url_that_is_no_url_is_refused_without_quoting_its_password(tmp_path: Path) -> None:
    """A libpq "key=value" string was quoted whole, password and all, by doctor, run and pending."""
    from robot.storage import StorageError, open_database

    with pytest.raises(StorageError) as refused:
        open_database("host=db.internal user=bot password=Hunter2-TopSecret dbname=q", tmp_path)
    assert "Hunter2" not in str(refused.value) and "without a scheme" in str(refused.value)
    with pytest.raises(StorageError, match="'mysql'"):
        open_database("mysql://bot:Hunter2@db/q", tmp_path)


def test_a_config_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Notepad's UTF-8 starts with a BOM: it was "not valid TOML: Invalid statement (at line 1, column 1)"."""
    path = tmp_path / "q.toml"
    path.write_bytes("\ufeff[bot]\nname = \"小Q\"\n".encode())
    settings, _ = load_settings(path)
    assert settings.bot.name == "小Q"



def test_a_tier_streams_as_llm_unless_it_says_otherwise(tmp_path: Path) -> None:
    """A provider may refuse to stream one model (OpenAI's o3 for an unverified organisation): [llm.think]
    stream = false was refused as an unknown key."""
    path = write(tmp_path / "qunbot.toml", '[llm.think]\nmodel = "o3"\nstream = false\n[llm.plan]\nmodel = "p"\n')
    settings, _ = load_settings(path)
    assert settings.llm.think is not None and settings.llm.think.stream is False
    assert settings.llm.plan is not None and settings.llm.plan.stream is None
