"""WeCom callback encryption (the ``WXBizMsgCrypt`` scheme) on the ``cryptography`` package.

Scheme (developer.work.weixin.qq.com/document/path/91144, 加解密方案说明):
AES-256-CBC, key = base64(EncodingAESKey + "="), IV = key[:16]; plaintext =
16 random bytes + 4-byte big-endian length + msg + receive_id, PKCS#7-padded to 32 bytes;
``msg_signature = sha1("".join(sorted([token, timestamp, nonce, encrypt])))``.
The AI bot (智能机器人) uses the same scheme with JSON bodies and an empty receive_id
(document/path/101033).

Errors (all subclasses of :class:`robot.channels.base.ChannelError`)::

    WeComCryptoError
    ├── SignatureError      msg_signature does not match
    ├── DecryptError        bad base64, bad padding, bad length prefix
    ├── ReceiveIdMismatch   the message was encrypted for another corp / app
    └── MalformedBody       the XML/JSON envelope cannot be read (or declares entities)

No message here ever contains the key or the token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import struct
import xml.etree.ElementTree as ET
from xml.parsers import expat

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from robot.channels.base import ChannelError

__all__ = [
    "DecryptError",
    "MalformedBody",
    "ReceiveIdMismatch",
    "SignatureError",
    "WeComCrypto",
    "WeComCryptoError",
    "parse_xml",
]

_BLOCK = 32
_AES_KEY_RE = re.compile(r"[A-Za-z0-9]{43}")
# The one value the signature covers, found without an XML parser: nothing unauthenticated is parsed.
# Possessive quantifiers: with plain ones a body of "<Encrypt>" and spaces (no signature needed) took
# cubic time, 10 s of a frozen event loop for 2.5 KB.
_ENCRYPT_RE = re.compile(rb"<Encrypt>\s*+(?:<!\[CDATA\[([^\]<>]*+)\]\]>\s*+|([^<>]*+))</Encrypt>")


class WeComCryptoError(ChannelError):
    """A callback could not be authenticated or decrypted."""


class SignatureError(WeComCryptoError):
    """The msg_signature does not match token, timestamp, nonce and ciphertext."""


class DecryptError(WeComCryptoError):
    """The ciphertext is not valid base64, has bad padding or a bad length prefix."""


class ReceiveIdMismatch(WeComCryptoError):
    """The decrypted receive_id is not ours."""


class MalformedBody(WeComCryptoError):
    """The request envelope (XML or JSON) is unreadable."""


def _refuse_dtd(*_: object) -> None:
    raise MalformedBody("XML with DOCTYPE/ENTITY declarations is refused")


def parse_xml(data: bytes | str) -> ET.Element:
    """Parse a small XML document, refusing DOCTYPE/ENTITY declarations in any encoding.

    ElementTree expands internal entities ("billion laughs"), so expat itself (which decodes
    every encoding it accepts) reads the document first and stops at the first declaration.
    No byte filter: it cannot tell a real declaration from a user's text in CDATA mentioning one.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    scan = expat.ParserCreate()
    scan.StartDoctypeDeclHandler = _refuse_dtd
    scan.EntityDeclHandler = _refuse_dtd
    scan.UnparsedEntityDeclHandler = _refuse_dtd
    try:
        scan.Parse(raw, True)
        return ET.fromstring(raw)
    except (expat.ExpatError, ET.ParseError) as exc:
        raise MalformedBody(f"invalid XML: {exc}") from None
    except RecursionError:
        raise MalformedBody("XML nested too deeply") from None


class WeComCrypto:
    """Verify, decrypt and encrypt WeCom callbacks for one token / EncodingAESKey / receive_id."""

    def __init__(self, token: str, encoding_aes_key: str, receive_id: str) -> None:
        if not _AES_KEY_RE.fullmatch(encoding_aes_key):
            raise WeComCryptoError("EncodingAESKey must be 43 characters of [A-Za-z0-9]")
        self._token = token
        self._key = base64.b64decode(encoding_aes_key + "=")
        self._receive_id = receive_id.encode("utf-8")

    def __repr__(self) -> str:
        return "WeComCrypto(token=***, key=***)"

    # -- signatures -------------------------------------------------------------------------

    def signature(self, timestamp: str, nonce: str, encrypt: str) -> str:
        """The ``msg_signature`` WeCom computes for these values."""
        joined = "".join(sorted([self._token, timestamp, nonce, encrypt]))
        return hashlib.sha1(joined.encode("utf-8")).hexdigest()

    def check_signature(self, msg_signature: str, timestamp: str, nonce: str, encrypt: str) -> None:
        """Raise :class:`SignatureError` unless the signature matches (constant-time compare)."""
        expected = self.signature(timestamp, nonce, encrypt)
        if not hmac.compare_digest(expected.encode("ascii"), msg_signature.lower().encode("utf-8")):
            raise SignatureError("msg_signature mismatch")

    # -- decrypt ----------------------------------------------------------------------------

    def verify_url(self, msg_signature: str, timestamp: str, nonce: str, echostr: str) -> str:
        """GET URL verification: check the signature and return the decrypted echostr."""
        self.check_signature(msg_signature, timestamp, nonce, echostr)
        return self.decrypt_raw(echostr)

    def decrypt(self, msg_signature: str, timestamp: str, nonce: str, encrypt: str) -> str:
        """Check the signature, then decrypt one ``Encrypt`` / ``encrypt`` value."""
        self.check_signature(msg_signature, timestamp, nonce, encrypt)
        return self.decrypt_raw(encrypt)

    def decrypt_xml(self, msg_signature: str, timestamp: str, nonce: str, body: bytes | str) -> str:
        """Decrypt an XML callback body (``<xml><Encrypt>...</Encrypt></xml>``).

        The ``Encrypt`` value is found without parsing the XML and the signature is checked
        before anything else: no XML parser ever sees an unauthenticated body.
        """
        raw = body.encode("utf-8") if isinstance(body, str) else body
        found = _ENCRYPT_RE.findall(raw)
        if len(found) != 1:
            raise MalformedBody("XML body needs exactly one <Encrypt> element")
        cdata, plain = found[0]
        try:
            encrypt = (cdata or plain).decode("ascii").strip()
        except UnicodeDecodeError:
            raise MalformedBody("<Encrypt> is not base64") from None
        if not encrypt:
            raise MalformedBody("XML body has an empty <Encrypt> element")
        return self.decrypt(msg_signature, timestamp, nonce, encrypt)

    def decrypt_json(self, msg_signature: str, timestamp: str, nonce: str, body: bytes | str) -> str:
        """Decrypt an AI-bot JSON callback body (``{"encrypt": "..."}``)."""
        try:
            envelope = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise MalformedBody("body is not JSON (or is nested too deeply)") from None
        encrypt = envelope.get("encrypt") if isinstance(envelope, dict) else None
        if not isinstance(encrypt, str) or not encrypt:
            raise MalformedBody('JSON body has no "encrypt" string')
        return self.decrypt(msg_signature, timestamp, nonce, encrypt)

    def decrypt_raw(self, encrypt: str) -> str:
        """Decrypt a base64 ciphertext without a signature check (callers check first)."""
        try:
            data = base64.b64decode(encrypt, validate=True)
        except (binascii.Error, ValueError):
            raise DecryptError("ciphertext is not valid base64") from None
        if not data or len(data) % 16:
            raise DecryptError("ciphertext length is not a multiple of the AES block")
        decryptor = Cipher(algorithms.AES(self._key), modes.CBC(self._key[:16])).decryptor()
        plain = decryptor.update(data) + decryptor.finalize()
        pad = plain[-1]
        if not 1 <= pad <= _BLOCK or pad > len(plain) or plain[-pad:] != bytes([pad]) * pad:
            raise DecryptError("bad PKCS#7 padding (wrong EncodingAESKey?)")
        plain = plain[:-pad]
        if len(plain) < 20:
            raise DecryptError("decrypted payload is too short")
        (length,) = struct.unpack(">I", plain[16:20])
        if length > len(plain) - 20:
            raise DecryptError("decrypted length prefix exceeds the payload")
        msg, receive_id = plain[20 : 20 + length], plain[20 + length :]
        # Exact, as WeCom's SDKs (XML and JSON) compare: the AI bot's receive_id is "" and must be.
        if not hmac.compare_digest(receive_id, self._receive_id):
            raise ReceiveIdMismatch("message was encrypted for another receive_id")
        try:
            return msg.decode("utf-8")
        except UnicodeDecodeError:
            raise DecryptError("decrypted message is not UTF-8") from None

    # -- encrypt ----------------------------------------------------------------------------

    def encrypt(self, msg: str, *, random_prefix: bytes | None = None) -> str:
        """Encrypt ``msg`` to a base64 ciphertext (``random_prefix`` is for tests only)."""
        prefix = os.urandom(16) if random_prefix is None else random_prefix
        if len(prefix) != 16:
            raise ValueError("random_prefix must be 16 bytes")
        body = msg.encode("utf-8")
        plain = prefix + struct.pack(">I", len(body)) + body + self._receive_id
        pad = _BLOCK - len(plain) % _BLOCK
        plain += bytes([pad]) * pad
        encryptor = Cipher(algorithms.AES(self._key), modes.CBC(self._key[:16])).encryptor()
        return base64.b64encode(encryptor.update(plain) + encryptor.finalize()).decode("ascii")

    def encrypt_xml_reply(self, msg: str, timestamp: str, nonce: str) -> str:
        """A passive XML reply: Encrypt, MsgSignature, TimeStamp, Nonce."""
        encrypt = self.encrypt(msg)
        root = ET.Element("xml")
        for tag, value in (
            ("Encrypt", encrypt),
            ("MsgSignature", self.signature(timestamp, nonce, encrypt)),
            ("TimeStamp", timestamp),
            ("Nonce", nonce),
        ):
            ET.SubElement(root, tag).text = value
        return ET.tostring(root, encoding="unicode")

    def encrypt_json_reply(self, msg: str, timestamp: str, nonce: str) -> dict[str, str]:
        """A passive AI-bot JSON reply: encrypt, msgsignature, timestamp, nonce (document/path/101033)."""
        encrypt = self.encrypt(msg)
        return {
            "encrypt": encrypt,
            "msgsignature": self.signature(timestamp, nonce, encrypt),
            "timestamp": timestamp,
            "nonce": nonce,
        }
