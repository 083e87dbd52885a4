"""How an agent trusts the control plane's TLS certificate, and the pins it uses.

Two modes, chosen per control-plane address:

- **CA mode** (no pin): the default verification of :func:`ssl.create_default_context`
  (the system's CA store, or ``SSL_CERT_FILE``; issuer and host name checked on
  every connection). Nothing is recorded, so a renewal with a new key keeps working.
- **Pin mode** (``--ca-fingerprint sha256:<64 hex>``): neither issuer nor host name
  is checked; instead the SHA-256 of the leaf certificate's SubjectPublicKeyInfo
  must equal the pin. It is compared with the certificate of the very connection
  that is about to carry the worker token, after its handshake completed (so the
  server proved it holds that key) and before a byte of HTTP is written: a
  mismatch closes the socket with nothing sent. The leaf is what
  ``getpeercert(binary_form=True)`` returns on every Python version; no chain
  certificate is ever compared.

The same :class:`Trust` serves enrollment (urllib, :meth:`Trust.opener`),
``/ws/worker`` and every file transfer (one aiohttp session whose connector
carries :meth:`Trust.aiohttp_ssl`).

The SPKI is cut out of the DER certificate by hand (standard library only):
a certificate is ``SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL,
serialNumber, signature, issuer, validity, subject, subjectPublicKeyInfo, ... },
...}``, and the pin hashes the whole ``subjectPublicKeyInfo`` element, tag and
length included, as ``openssl pkey -pubin -outform der`` writes it.

On the control plane, :class:`ServerCert` reads ``CODEFYUI_TLS_CERT_FILE`` for the
fingerprint shown with generated agent commands, again only when the file changed.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import http.client
import json
import logging
import os
import re
import ssl
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from cdui.core.atomic import write_private
from cdui.core.config import MAX_CONTROL_URL
from cdui.core.errors import CduiError
from cdui.core.netaddr import is_loopback_host
from cdui.core.units import size_text

log = logging.getLogger("cdui.core.trust")

PIN_RE = re.compile(r"sha256:([0-9a-fA-F]{64})")
MAX_CERT_DER = 64 * 1024  # far above any real leaf; bounds the parse of what a server sends
MAX_PEM_FILE = 1024 * 1024  # a fullchain.pem is a few KiB
CREDENTIAL_KEY = "ca_fingerprint"  # the pin's field in the agent's credential file
NEXT_KEY = "ca_fingerprint_next"  # the next pin's (a planned key rotation of the proxy)

# The documented way to print a certificate's pin on the proxy host (first certificate = leaf).
OPENSSL_COMMAND = ("openssl x509 -in {path} -pubkey -noout | openssl pkey -pubin -outform der | "
                   "openssl dgst -sha256 | awk '{{print \"sha256:\" $NF}}'")


def openssl_command(path: str = "/path/to/fullchain.pem") -> str:
    return OPENSSL_COMMAND.format(path=path)


# -- DER and fingerprints ------------------------------------------------------------
class CertificateError(ValueError):
    """The bytes are not a DER certificate this parser can read."""


def _element(der: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """The DER element at ``pos`` (inside ``der[:end]``): (tag, start of its value, end of the element)."""
    if pos + 2 > end:
        raise CertificateError("truncated element header")
    tag, first = der[pos], der[pos + 1]
    if tag & 0x1F == 0x1F:
        raise CertificateError("multi-byte tags do not occur in the certificate fields read here")
    if first < 0x80:
        length, start = first, pos + 2
    else:
        n = first & 0x7F
        # 0x80 is BER's indefinite length, which DER forbids; 4 length bytes already mean 4 GiB.
        if n == 0 or n > 4 or pos + 2 + n > end:
            raise CertificateError("bad length")
        length, start = int.from_bytes(der[pos + 2:pos + 2 + n], "big"), pos + 2 + n
    if start + length > end:
        raise CertificateError("element runs past its container")
    return tag, start, start + length


SEQUENCE, INTEGER, VERSION_TAG = 0x30, 0x02, 0xA0


def spki_der(cert_der: bytes) -> bytes:
    """The subjectPublicKeyInfo element (tag, length and value) of a DER X.509 certificate."""
    if not isinstance(cert_der, (bytes, bytearray)) or not cert_der:
        raise CertificateError("no certificate")
    if len(cert_der) > MAX_CERT_DER:
        raise CertificateError(f"certificate of {len(cert_der)} bytes is over {MAX_CERT_DER}")
    der = bytes(cert_der)
    tag, cstart, cend = _element(der, 0, len(der))
    if tag != SEQUENCE:
        raise CertificateError("a certificate is a SEQUENCE")
    tag, pos, tend = _element(der, cstart, cend)
    if tag != SEQUENCE:
        raise CertificateError("tbsCertificate is a SEQUENCE")
    tag, _, nxt = _element(der, pos, tend)
    if tag == VERSION_TAG:
        pos = nxt
    # serialNumber, then signature, issuer, validity and subject, each skipped whole.
    for want, what in ((INTEGER, "serialNumber"), (SEQUENCE, "signature"), (SEQUENCE, "issuer"),
                       (SEQUENCE, "validity"), (SEQUENCE, "subject")):
        tag, _, nxt = _element(der, pos, tend)
        if tag != want:
            raise CertificateError(f"{what} has tag 0x{tag:02x}, expected 0x{want:02x}")
        pos = nxt
    tag, _, nxt = _element(der, pos, tend)
    if tag != SEQUENCE:
        raise CertificateError("subjectPublicKeyInfo is a SEQUENCE")
    return der[pos:nxt]


def spki_fingerprint(cert_der: bytes) -> str:
    """``sha256:<hex>`` of the certificate's SubjectPublicKeyInfo (the ``--ca-fingerprint`` form)."""
    return "sha256:" + hashlib.sha256(spki_der(cert_der)).hexdigest()


def pem_leaf_der(text: str) -> bytes:
    """The first certificate of a PEM file (a fullchain.pem starts with the leaf) as DER."""
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    i = text.find(begin)
    j = text.find(end, i)
    if i < 0 or j < 0:
        raise CertificateError("no PEM certificate (-----BEGIN CERTIFICATE-----) in it")
    try:
        return ssl.PEM_cert_to_DER_cert(text[i:j + len(end)] + "\n")
    except ValueError as exc:
        raise CertificateError(f"the first PEM certificate does not decode: {exc}") from None


def parse_pin(value: Any, where: str = "--ca-fingerprint") -> str:
    """A pin in its one written form, lower-case; a clear error for anything else."""
    if isinstance(value, str) and PIN_RE.fullmatch(value.strip()):
        return value.strip().lower()
    shown = value if not isinstance(value, str) else value[:100]
    raise CduiError("bad_fingerprint", f"{where} {shown!r} is not a key fingerprint",
                    hint="write it as sha256:<64 hex characters>; print it on the proxy host with "
                         f"`{openssl_command()}`")


# -- the agent's side ----------------------------------------------------------------
class PinMismatch(CduiError):
    """The server's key is not the pinned one; the connection was closed with nothing sent."""

    def __init__(self, address: str, expected: str, got: str, source: str) -> None:
        super().__init__(
            "pin_mismatch",
            f"the certificate of {address} does not match the pinned key: expected {expected} ({source}), "
            f"the server presented {got}; nothing was sent to it",
            hint=f"if the proxy's key changed on purpose, confirm the new fingerprint on the proxy host with "
                 f"`{openssl_command()}`, then run `cdui agent start --control URL --ca-fingerprint {got}` "
                 f"(keeps this worker's credential) or `cdui agent forget URL` (enroll again)",
            status=495)
        self.address, self.expected, self.got = address, expected, got


class AiohttpPinMismatch(aiohttp.ServerFingerprintMismatch):
    """aiohttp's own mismatch type (its connector closes the transport on it), carrying ours."""

    def __init__(self, error: PinMismatch, host: str, port: int) -> None:
        super().__init__(bytes.fromhex(error.expected[7:]), bytes.fromhex(error.got[7:]), host, port)
        self.error = error

    def __str__(self) -> str:
        return str(self.error)


class _SpkiPin(aiohttp.Fingerprint):
    """An aiohttp ``ssl=`` value that checks the leaf's SPKI instead of the whole certificate.

    aiohttp calls ``check`` on the freshly handshaken transport before it writes the
    request (the token travels in its headers), and closes the transport when it raises."""

    def __init__(self, trust: Trust) -> None:
        pin = trust.pin or trust.next_pin
        assert pin is not None
        super().__init__(bytes.fromhex(pin[7:]))  # unused: check() below compares the SPKI
        self.trust = trust

    def check(self, transport: asyncio.Transport) -> None:
        sslobj = transport.get_extra_info("ssl_object")
        peer = transport.get_extra_info("peername") or ("?", 0)
        host, port = str(peer[0]), int(peer[1])
        der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
        try:
            self.trust.check(der, f"{host}:{port}")
        except PinMismatch as exc:
            raise AiohttpPinMismatch(exc, host, port) from None


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection that compares the pin right after its handshake, before the request."""

    def __init__(self, *args: Any, trust: Trust, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trust = trust

    def connect(self) -> None:
        super().connect()
        assert isinstance(self.sock, ssl.SSLSocket)
        try:
            self._trust.check(self.sock.getpeercert(binary_form=True), f"{self.host}:{self.port}")
        except PinMismatch:
            self.sock.close()
            raise


class _PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, trust: Trust) -> None:
        super().__init__(context=trust.ssl_context())
        self._trust = trust

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        conn = functools.partial(_PinnedHTTPSConnection, trust=self._trust)
        return self.do_open(conn, req, context=self._context)  # type: ignore[attr-defined]


@dataclass
class Trust:
    """How this agent checks the certificate of one control-plane address.

    ``next_pin`` is the key the proxy will have after a planned rotation: a certificate with either key
    passes, so a worker that reconnects after the proxy switched keys is not stranded. ``verified`` is
    the pin the last handshake matched (reported to the control plane). ``reload`` takes the pins from
    the credential file again, so a next pin added with ``cdui agent pin`` counts without a restart."""

    pin: str | None = None
    source: str = "--ca-fingerprint"  # where the pin came from, for messages
    next_pin: str | None = None
    cred_path: Path | None = None
    verified: str | None = field(default=None, compare=False)

    @property
    def pinned(self) -> bool:
        return self.pin is not None or self.next_pin is not None

    def ssl_context(self) -> ssl.SSLContext:
        if not self.pinned:
            return ssl.create_default_context()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        # The pin replaces issuer and host-name checks; it is compared after the handshake.
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def check(self, cert_der: bytes | None, address: str) -> None:
        """Raise :class:`PinMismatch` unless the handshake's leaf certificate carries a pinned key."""
        if not self.pinned:
            return
        try:
            got = spki_fingerprint(cert_der or b"")
        except CertificateError as exc:
            got = f"(no readable certificate: {exc})"
        if got in (self.pin, self.next_pin):
            self.verified = got
            return
        expected = self.pin or self.next_pin
        assert expected is not None
        source = self.source + (f"; next pin {self.next_pin}" if self.pin and self.next_pin else "")
        raise PinMismatch(address, expected, got, source)

    def reload(self) -> None:
        """The pins stored in the credential file now (a flag's pin stays until it is recorded)."""
        if self.cred_path is None:
            return
        try:
            cred = json.loads(self.cred_path.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(cred, dict):
            return
        stored, nxt = _valid_pin(cred.get(CREDENTIAL_KEY)), _valid_pin(cred.get(NEXT_KEY))
        if stored is not None and self.source != "--ca-fingerprint":
            self.pin = stored
        self.next_pin = nxt

    def aiohttp_ssl(self) -> ssl.SSLContext | aiohttp.Fingerprint:
        return _SpkiPin(self) if self.pinned else ssl.create_default_context()

    def connector(self) -> aiohttp.TCPConnector:
        """The connector of the agent's one session: ``/ws/worker`` and every file transfer."""
        return aiohttp.TCPConnector(ssl=self.aiohttp_ssl())

    def opener(self) -> urllib.request.OpenerDirector:
        """A urllib opener for enrollment with the same check."""
        if not self.pinned:
            return urllib.request.build_opener(urllib.request.HTTPSHandler(context=self.ssl_context()))
        return urllib.request.build_opener(_PinnedHTTPSHandler(self))


def presented_fingerprint(host: str, port: int, timeout: float = 10.0) -> str:
    """The key fingerprint a server presents, read over a throwaway handshake that sends nothing.

    Only for messages (so the operator can compare it): nothing is trusted on its strength."""
    try:
        pem = ssl.get_server_certificate((host, port), timeout=timeout)
        return spki_fingerprint(ssl.PEM_cert_to_DER_cert(pem))
    except (OSError, ValueError) as exc:
        return f"(could not read it: {exc})"


def untrusted_message(control: str, reason: Any, presented: str | None) -> str:
    """What to tell the operator when the certificate is neither CA-trusted nor pinned."""
    u = urlsplit(control)
    text = f"the TLS certificate of {u.hostname}:{u.port or 443} is not trusted: {reason}"
    if presented is not None:
        text += (f"; the server presented the key {presented}. If the proxy's own fingerprint (on the proxy host: "
                 f"`{openssl_command()}`) is the same, give --ca-fingerprint {presented} (`cdui agent start` and "
                 f"`cdui workers ...` take it); or install the CA that signed it on this machine")
    return text


def untrusted_error(control: str, reason: ssl.SSLCertVerificationError) -> CduiError:
    u = urlsplit(control)
    presented = presented_fingerprint(u.hostname or "localhost", u.port or 443)
    return CduiError("untrusted_certificate",
                     untrusted_message(control, reason.verify_message or reason, presented), status=495)


def stored_pin(cred: dict[str, Any] | None, cred_path: Path, warn: Callable[[str], None]) -> str | None:
    """The pin kept in the credential file, or None; an invalid one is reported (naming the file) and ignored."""
    value = (cred or {}).get(CREDENTIAL_KEY)
    if value is None:
        return None
    try:
        return parse_pin(value, "stored ca_fingerprint")
    except CduiError:
        warn(f"{cred_path}: its ca_fingerprint {str(value)[:100]!r} is not a valid fingerprint "
             f"(sha256:<64 hex characters>); ignoring it, so the certificate is checked against this machine's CAs "
             f"(the worker credential is still used). Give --ca-fingerprint to record a valid one")
        return None


def _valid_pin(value: Any) -> str | None:
    try:
        return parse_pin(value) if value is not None else None
    except CduiError:
        return None


def agent_trust(flag: str | None, cred: dict[str, Any] | None, cred_path: Path,
                warn: Callable[[str], None]) -> Trust:
    """The flag's pin if given (already parsed), else the stored one, else CA mode; with the stored
    next pin beside it."""
    nxt = _valid_pin((cred or {}).get(NEXT_KEY))
    if flag is not None:
        return Trust(flag, "--ca-fingerprint", nxt, cred_path)
    pin = stored_pin(cred, cred_path, warn)
    if pin is None and nxt is None:
        return Trust(cred_path=cred_path)
    return Trust(pin, f"stored in {cred_path}", nxt, cred_path)


def record_pin(cred_path: Path, pin: str) -> bool:
    """Write ``pin`` into the credential file (after a connection it let through); True if it changed.
    A next pin that is now the pin is used up: the rotation it was kept for happened."""
    try:
        cred = json.loads(cred_path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("could not record the pin %s in %s: %s", pin, cred_path, exc)
        return False
    if not isinstance(cred, dict) or (cred.get(CREDENTIAL_KEY) == pin and cred.get(NEXT_KEY) != pin):
        return False
    cred[CREDENTIAL_KEY] = pin
    if cred.get(NEXT_KEY) == pin:
        del cred[NEXT_KEY]
    write_private(cred_path, json.dumps(cred))
    return True


def record_next_pin(cred_path: Path, pin: str | None) -> None:
    """``cdui agent pin --next``: keep ``pin`` as the proxy's next key beside the current one (None: drop it)."""
    cred = json.loads(cred_path.read_text())
    if pin is None:
        cred.pop(NEXT_KEY, None)
    else:
        cred[NEXT_KEY] = pin
    write_private(cred_path, json.dumps(cred))


# -- the control plane's side ----------------------------------------------------------
class ServerCert:
    """The fingerprint of ``CODEFYUI_TLS_CERT_FILE``, read again only when the file changed.

    A renewal replaces the file (new inode, size or modification time); an unreadable or
    malformed file is logged once per change and yields None, so token answers still work."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self._key: tuple[int, int, int] | None = None
        self._fingerprint: str | None = None
        self.reads = 0  # how often the file was parsed (tests check it is only on change)

    def fingerprint(self) -> str | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if self._key != (-1, -1, -1):
                log.warning("CODEFYUI_TLS_CERT_FILE %s cannot be read: %s; generated agent commands carry no "
                            "--ca-fingerprint", self.path, exc)
            self._key, self._fingerprint = (-1, -1, -1), None
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key != self._key:
            self._key = key
            self._fingerprint = self._read(st.st_size)
        return self._fingerprint

    def _read(self, size: int) -> str | None:
        assert self.path is not None
        self.reads += 1
        try:
            if size > MAX_PEM_FILE:
                raise CertificateError(f"{size_text(size)} is over {size_text(MAX_PEM_FILE)}; is it the certificate?")
            with open(self.path, encoding="ascii", errors="replace") as fh:
                text = fh.read(MAX_PEM_FILE)
            return spki_fingerprint(pem_leaf_der(text))
        except (OSError, CertificateError) as exc:
            log.warning("CODEFYUI_TLS_CERT_FILE %s: %s; generated agent commands carry no --ca-fingerprint",
                        self.path, exc)
            return None


def advertised_control(scheme: str, host: str, asked: Any, behind_tls_proxy: bool,
                       public: str | None = None, allowed_names: Collection[str] = ()) -> str:
    """The control-plane address a generated agent command names.

    ``asked`` (the client's word: the browser's own origin, which behind a TLS proxy is
    ``https`` while this server only sees plain HTTP, or ``cdui workers token --public-url``)
    must be this server as the request reached it, a name the operator allowed as ``Host``
    (``CODEFYUI_EXTRA_ALLOWED_HOSTS``: the proxy's public name) or its public address
    (``CODEFYUI_PUBLIC_URL``). Without it, the public address when there is one; else the
    host this request used (already checked against the allowed hosts) with the connection's
    scheme, ``https`` when a proxy certificate is configured, except on a loopback address:
    the proxy does not listen on this server's own port, so ``https://127.0.0.1:8000`` would
    reach nothing."""
    if asked is not None:
        u = urlsplit(asked) if isinstance(asked, str) and len(asked) <= MAX_CONTROL_URL else None
        as_reached = (u is not None and u.scheme in ("http", "https") and not u.username
                      and u.netloc.lower() in {host.lower(), *(n.lower() for n in allowed_names)}
                      and u.path in ("", "/") and not u.query and not u.fragment)
        if as_reached and u is not None:
            return f"{u.scheme}://{u.netloc}"
        if public is not None and isinstance(asked, str) and asked.strip().rstrip("/").lower() == public.lower():
            return public
        raise CduiError("bad_request", f"control={str(asked)[:MAX_CONTROL_URL]!r} is not this server's own "
                                       f"address as the client reached it" +
                        (f", nor its public address {public}" if public else ""),
                        hint=f"give http://{host} or https://{host} (the page's origin)" +
                             (f" or {public}" if public else ", or set CODEFYUI_PUBLIC_URL to the address workers "
                                                              "use") + ", or leave it out")
    if public is not None:
        return public
    if scheme == "http" and behind_tls_proxy and not _loopback_host(host):
        scheme = "https"
    return f"{scheme}://{host}"


def _loopback_host(host: str) -> bool:
    name = host[1:host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
    return is_loopback_host(name)


def token_trust_fields(control: str, cert: ServerCert) -> dict[str, str]:
    """What a token answer adds for an ``https://`` address: the command that prints the
    proxy's pin and, when the certificate file is readable, the pin itself."""
    if urlsplit(control).scheme != "https":
        return {}
    out = {"fingerprint_command": openssl_command(str(cert.path) if cert.path else "/path/to/fullchain.pem")}
    fp = cert.fingerprint()
    if fp is not None:
        out["ca_fingerprint"] = fp
    return out
