"""WeCom callback crypto: the official vectors, round trips and tampering."""

from __future__ import annotations

import base64
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

import robot.channels.wecom as wecom_pkg
from robot.channels.wecom import WeComCrypto, WeComSettings
from robot.channels.wecom.crypto import (
    DecryptError,
    MalformedBody,
    ReceiveIdMismatch,
    SignatureError,
    WeComCryptoError,
    parse_xml,
)

VECTORS_PATH = Path(__file__).resolve().parents[3] / "vectors" / "wecom_callback.json"


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
    return data


@pytest.fixture
def crypto(vectors: dict[str, Any]) -> WeComCrypto:
    return WeComCrypto(vectors["token"], vectors["encoding_aes_key"], vectors["receive_id"])


def test_official_verify_url_vector(crypto: WeComCrypto, vectors: dict[str, Any]) -> None:
    v = vectors["verify_url"]
    plain = crypto.verify_url(v["msg_signature"], v["timestamp"], v["nonce"], v["echostr"])
    assert plain == v["expected_plaintext"]


def test_official_decrypt_message_vector(crypto: WeComCrypto, vectors: dict[str, Any]) -> None:
    v = vectors["decrypt_message"]
    plain = crypto.decrypt_xml(v["msg_signature"], v["timestamp"], v["nonce"], v["post_body"])
    assert plain == v["expected_plaintext"]


def test_signature_matches_official_vector(crypto: WeComCrypto, vectors: dict[str, Any]) -> None:
    v = vectors["verify_url"]
    assert crypto.signature(v["timestamp"], v["nonce"], v["echostr"]) == v["msg_signature"]


def test_encrypt_decrypt_roundtrip(crypto: WeComCrypto) -> None:
    text = "<xml><Content>你好, world ✓</Content></xml>"
    encrypt = crypto.encrypt(text)
    assert len(base64.b64decode(encrypt)) % 32 == 0
    sig = crypto.signature("1700000000", "nonce", encrypt)
    assert crypto.decrypt(sig, "1700000000", "nonce", encrypt) == text
    # Two encryptions of the same text differ (random prefix).
    assert crypto.encrypt(text) != encrypt


def test_xml_and_json_replies_decrypt(crypto: WeComCrypto) -> None:
    reply = parse_xml(crypto.encrypt_xml_reply("<xml>hi</xml>", "123", "n1"))
    assert reply.findtext("TimeStamp") == "123"
    assert (
        crypto.decrypt(reply.findtext("MsgSignature") or "", "123", "n1", reply.findtext("Encrypt") or "")
        == "<xml>hi</xml>"
    )
    js = crypto.encrypt_json_reply('{"a": 1}', "123", "n1")
    assert crypto.decrypt(js["msgsignature"], js["timestamp"], js["nonce"], js["encrypt"]) == '{"a": 1}'


def test_bad_signature_rejected(crypto: WeComCrypto, vectors: dict[str, Any]) -> None:
    v = vectors["verify_url"]
    with pytest.raises(SignatureError):
        crypto.verify_url("0" * 40, v["timestamp"], v["nonce"], v["echostr"])
    with pytest.raises(SignatureError):
        crypto.verify_url(v["msg_signature"], "1476416374", v["nonce"], v["echostr"])


def test_tampered_ciphertext_is_rejected(crypto: WeComCrypto) -> None:
    raw = bytearray(base64.b64decode(crypto.encrypt("hello", random_prefix=b"0123456789abcdef")))
    raw[-1] ^= 0xFF  # garbles the last block, hence the padding
    with pytest.raises(WeComCryptoError):
        crypto.decrypt_raw(base64.b64encode(bytes(raw)).decode())


def test_bad_base64_and_short_ciphertext(crypto: WeComCrypto) -> None:
    with pytest.raises(DecryptError):
        crypto.decrypt_raw("not base64 !!!")
    with pytest.raises(DecryptError):
        crypto.decrypt_raw(base64.b64encode(b"short").decode())


def test_unsigned_bodies_built_to_stall_the_envelope_search_are_refused() -> None:
    """The search runs before the signature check: "<Encrypt>" and 200 KB of spaces (under the body
    limit) must be refused, not searched in cubic time. A child process, so a regression hangs only it
    (2.5 KB froze the loop for 10 s; 200 KB would run for days)."""
    code = ("from robot.channels.wecom.crypto import MalformedBody, WeComCrypto\n"
            "c = WeComCrypto('t', 'a' * 43, 'corp')\n"
            "for tail in (b' ' * 200_000, b' ' * 100_000 + b'x' * 100_000, b'\\t\\n ' * 60_000 + b'</Encrypt'):\n"
            "    try:\n        c.decrypt_xml('0' * 40, '1', 'n', b'<xml><Encrypt>' + tail)\n"
            "    except MalformedBody as exc:\n        print('refused:', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
    assert done.stdout.decode().splitlines() == ["refused: XML body needs exactly one <Encrypt> element"] * 3


def test_envelopes_with_spaces_around_the_value_still_parse(crypto: WeComCrypto) -> None:
    value = crypto.encrypt("<xml><Content>hi</Content></xml>")
    signature = crypto.signature("1700000000", "n", value)
    for body in (f"<xml><Encrypt>  <![CDATA[{value}]]>\n </Encrypt></xml>", f"<xml><Encrypt>\n{value}  </Encrypt></xml>"):
        assert "hi" in crypto.decrypt_xml(signature, "1700000000", "n", body)


def test_receive_id_mismatch(vectors: dict[str, Any]) -> None:
    other = WeComCrypto(vectors["token"], vectors["encoding_aes_key"], "ww_someone_else")
    v = vectors["verify_url"]
    with pytest.raises(ReceiveIdMismatch):
        other.verify_url(v["msg_signature"], v["timestamp"], v["nonce"], v["echostr"])


def test_wrong_key_fails_cleanly(vectors: dict[str, Any]) -> None:
    wrong = WeComCrypto(vectors["token"], "A" * 43, vectors["receive_id"])
    v = vectors["verify_url"]
    with pytest.raises(WeComCryptoError):
        wrong.verify_url(v["msg_signature"], v["timestamp"], v["nonce"], v["echostr"])


def test_entity_declarations_refused(crypto: WeComCrypto) -> None:
    bomb = '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><xml><Encrypt>&a;</Encrypt></xml>'
    with pytest.raises(SignatureError):  # the signature is checked before any XML is parsed
        crypto.decrypt_xml("sig", "1", "2", bomb)
    with pytest.raises(MalformedBody):
        parse_xml(bomb)
    with pytest.raises(MalformedBody):
        parse_xml("<xml><unclosed></xml>")
    with pytest.raises(MalformedBody):
        crypto.decrypt_xml("sig", "1", "2", "<xml><ToUserName>x</ToUserName></xml>")
    with pytest.raises(MalformedBody):
        crypto.decrypt_json("sig", "1", "2", b"[1, 2]")


@pytest.mark.parametrize(
    "content",
    ["这个页面为什么白屏？<!DOCTYPE html><html></html>", 'XML 里 <!ENTITY name "value"> 是什么意思？', "<!doctype x>"],
)
def test_a_text_mentioning_a_declaration_is_read(content: str) -> None:
    """Only a real declaration is refused: the same characters inside CDATA are a user's text."""
    xml = f"<xml><MsgType><![CDATA[text]]></MsgType><Content><![CDATA[{content}]]></Content></xml>"
    assert parse_xml(xml).findtext("Content") == content
    assert parse_xml(xml.encode("utf-16")).findtext("Content") == content


@pytest.mark.parametrize(
    "prolog",
    [
        "<!DOCTYPE xml>",
        '<!DOCTYPE xml SYSTEM "file:///etc/passwd">',
        '<!DOCTYPE xml [<!ENTITY a "aaaa">]>',
        '<!DOCTYPE xml [<!ENTITY % p SYSTEM "http://127.0.0.1/x">%p;]>',
        '<!DOCTYPE xml [<!ENTITY u SYSTEM "x" NDATA gif>]>',
    ],
)
def test_a_real_declaration_is_still_refused(prolog: str) -> None:
    with pytest.raises(MalformedBody):
        parse_xml(f'<?xml version="1.0"?>{prolog}<xml><Content>x</Content></xml>')


def test_errors_and_reprs_never_show_the_key(vectors: dict[str, Any]) -> None:
    key = vectors["encoding_aes_key"]
    crypto = WeComCrypto(vectors["token"], key, vectors["receive_id"])
    assert key not in repr(crypto) and vectors["token"] not in repr(crypto)
    with pytest.raises(WeComCryptoError) as info:
        WeComCrypto(vectors["token"], key[:-1], "")
    assert key[:-1] not in str(info.value)


def test_settings_validate_aes_key_without_echoing_it() -> None:
    bad = "x" * 42
    with pytest.raises(ValidationError) as info:
        WeComSettings(encoding_aes_key=SecretStr(bad))
    assert bad not in str(info.value)
    with pytest.raises(ValidationError) as info:
        WeComSettings.model_validate({"encoding_aes_key": bad})
    assert bad not in str(info.value)


def test_settings_enabled_app_requires_credentials() -> None:
    with pytest.raises(ValidationError, match="corp_secret"):
        WeComSettings(enabled=True, token=SecretStr("t"), encoding_aes_key=SecretStr("a" * 43), corp_id="c")
    ok = WeComSettings(enabled=True, mode="aibot", token=SecretStr("t"), encoding_aes_key=SecretStr("a" * 43))
    assert ok.receive_id == "" and ok.port == 8766 and ok.path == "/wecom/callback"
    assert WeComSettings(corp_id="ww1", api_base="http://x/").receive_id == "ww1"
    assert WeComSettings(api_base="http://x/").api_base == "http://x"
    assert "t" * 10 not in repr(WeComSettings(token=SecretStr("t" * 10)))


def test_every_module_has_complete_all() -> None:
    for info in pkgutil.iter_modules(wecom_pkg.__path__):
        module = importlib.import_module(f"robot.channels.wecom.{info.name}")
        exported = module.__all__
        for name in exported:
            assert hasattr(module, name), f"{info.name}.{name}"
    for name in ("WeComChannel", "WeComSettings", "WeComWebhook", "WeComCrypto", "WeComAIBotChannel"):
        assert name in wecom_pkg.__all__
