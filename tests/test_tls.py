"""Trust between agent and control plane: TLS behind a proxy, key pinning, unencrypted-HTTP marking.

The fingerprint code is checked against the documented ``openssl`` pipeline on
certificates the tests make with the ``openssl`` CLI. The end-to-end tests put
the repository's own ``deploy/nginx/codefyui.conf`` (a real nginx, TLS on a
loopback port) in front of a real control plane and drive real agents through it.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cdui.core import trust
from cdui.core.errors import CduiError
from procs import REPO_ROOT, Proc, ServerProc, env_for, free_port, load_example, wait_for, wait_run

NGINX_CONF = REPO_ROOT / "deploy" / "nginx" / "codefyui.conf"


# -- certificates made with the openssl CLI -------------------------------------------------
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=120)


@dataclass
class Cert:
    cert: Path
    key: Path

    @property
    def der(self) -> bytes:
        return ssl.PEM_cert_to_DER_cert(self.cert.read_text())


def self_signed(d: Path, name: str, key: str = "ec") -> Cert:
    newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"] if key == "ec" else ["-newkey", "rsa:2048"]
    _openssl("req", "-x509", *newkey, "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "3",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", cwd=d)
    return Cert(d / f"{name}.pem", d / f"{name}.key")


def ca_and_leaf(d: Path) -> tuple[Cert, Cert, Path]:
    """A test CA, a leaf it signed for 127.0.0.1/localhost, and the proxy's fullchain (leaf first)."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.pem", "-days", "3", "-subj", "/CN=cdui test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "leaf.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
                                "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                                "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    _openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-out", "leaf.pem", "-extfile", "leaf.ext", cwd=d)
    chain = d / "fullchain.pem"
    chain.write_text((d / "leaf.pem").read_text() + (d / "ca.pem").read_text())
    return Cert(d / "ca.pem", d / "ca.key"), Cert(d / "leaf.pem", d / "leaf.key"), chain


def documented_fingerprint(pem: Path) -> str:
    """The pin as the documentation tells operators to print it."""
    out = subprocess.run(["bash", "-c", "set -o pipefail; " + trust.openssl_command(shlex.quote(str(pem)))],
                         check=True, capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


@dataclass
class Certs:
    a: Cert  # self-signed, EC
    b: Cert  # self-signed, RSA (the "new key" after a change)
    ca: Cert
    leaf: Cert  # signed by ca
    fullchain: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory, need_command: Any) -> Certs:
    need_command("openssl")
    d = tmp_path_factory.mktemp("certs")
    ca, leaf, chain = ca_and_leaf(d)
    return Certs(self_signed(d, "a"), self_signed(d, "b", key="rsa"), ca, leaf, chain)


# -- the fingerprint and pin code -------------------------------------------------------------
def test_spki_fingerprint_matches_the_documented_openssl_command(certs: Certs) -> None:
    """Our hand-written DER walk and openssl agree on EC and RSA keys, self-signed and CA-issued certificates."""
    for c in (certs.a, certs.b, certs.ca, certs.leaf):
        expected = documented_fingerprint(c.cert)
        assert expected.startswith("sha256:") and len(expected) == 71, expected
        assert trust.spki_fingerprint(c.der) == expected, c.cert
    # A fullchain's first certificate is the leaf: its pin, not the CA's.
    assert documented_fingerprint(certs.fullchain) == documented_fingerprint(certs.leaf.cert)
    assert trust.spki_fingerprint(trust.pem_leaf_der(certs.fullchain.read_text())) == \
        documented_fingerprint(certs.leaf.cert)
    assert len({trust.spki_fingerprint(c.der) for c in (certs.a, certs.b, certs.ca, certs.leaf)}) == 4


def test_spki_parser_refuses_what_is_not_a_certificate(certs: Certs) -> None:
    der = certs.a.der
    bad = [b"", b"\x30", b"\x02\x01\x00", der[:40], der[:-1] + b"", b"\x30\x80" + der[2:],
           b"\x30\x85\xff\xff\xff\xff\xff" + der[2:], b"\x30\x03\x30\x01\x02", b"\x31" + der[1:],
           b"\x30" + b"\x84\x00\x01\x00\x00" + b"\x00" * 70000]
    for value in bad:
        with pytest.raises(trust.CertificateError):
            trust.spki_fingerprint(value)
    with pytest.raises(trust.CertificateError, match="no PEM certificate"):
        trust.pem_leaf_der("not a pem file")


@pytest.mark.parametrize("value,ok", [
    ("sha256:" + "ab" * 32, "sha256:" + "ab" * 32),
    ("SHA256:" + "AB" * 32, None),  # the prefix is written in lower case, as kubeadm does
    ("sha256:" + "AB" * 32, "sha256:" + "ab" * 32),
    (" sha256:" + "0f" * 32 + "\n", "sha256:" + "0f" * 32),
    ("sha256:" + "ab" * 31, None),
    ("sha256:" + "ab" * 33, None),
    ("sha256:" + "zz" * 32, None),
    ("ab" * 32, None),
    ("sha1:" + "ab" * 20, None),
    ("sha256:" + ":".join(["ab"] * 32), None),
    (None, None), (12, None), ("", None),
])
def test_pin_format(value: Any, ok: str | None) -> None:
    if ok is None:
        with pytest.raises(CduiError) as e:
            trust.parse_pin(value)
        assert e.value.code == "bad_fingerprint" and "sha256:<64 hex characters>" in str(e.value)
    else:
        assert trust.parse_pin(value) == ok


def test_stored_pin_invalid_is_reported_naming_the_file_and_ignored(tmp_path: Path) -> None:
    warned: list[str] = []
    path = tmp_path / "127.0.0.1-8443.token"
    t = trust.agent_trust(None, {"credential": "c", "ca_fingerprint": "sha256:nothex"}, path, warned.append)
    assert t.pin is None and len(warned) == 1 and str(path) in warned[0] and "sha256:nothex" in warned[0]
    good = "sha256:" + "12" * 32
    assert trust.agent_trust(None, {"ca_fingerprint": good}, path, warned.append).pin == good
    assert trust.agent_trust("sha256:" + "34" * 32, {"ca_fingerprint": good}, path, warned.append).pin == \
        "sha256:" + "34" * 32
    assert len(warned) == 1


def test_server_cert_is_read_again_only_when_the_file_changes(certs: Certs, tmp_path: Path) -> None:
    f = tmp_path / "fullchain.pem"
    shutil.copy(certs.fullchain, f)
    sc = trust.ServerCert(str(f))
    leaf = documented_fingerprint(certs.leaf.cert)
    assert [sc.fingerprint() for _ in range(5)] == [leaf] * 5 and sc.reads == 1
    # A renewal writes a new file and renames it over the old one.
    shutil.copy(certs.a.cert, tmp_path / "new.pem")
    os.replace(tmp_path / "new.pem", f)
    assert sc.fingerprint() == documented_fingerprint(certs.a.cert) and sc.fingerprint() and sc.reads == 2
    f.write_text("garbage")
    assert sc.fingerprint() is None and sc.reads == 3
    f.unlink()
    assert sc.fingerprint() is None and sc.reads == 3
    assert trust.ServerCert(None).fingerprint() is None


@pytest.mark.parametrize("scheme,asked,proxy,expected", [
    ("http", None, False, "http://cp.lab:8000"),
    ("http", None, True, "https://cp.lab:8000"),
    ("http", "https://cp.lab:8000", False, "https://cp.lab:8000"),
    ("http", "http://cp.lab:8000/", True, "http://cp.lab:8000"),
    ("http", "https://evil.example:8000", False, None),
    ("http", "https://cp.lab:8000/x", False, None),
    ("http", "ftp://cp.lab:8000", False, None),
    ("http", "https://cp.lab:8000?a=1", False, None),
    ("http", 5, False, None),
])
def test_advertised_control(scheme: str, asked: Any, proxy: bool, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(CduiError) as e:
            trust.advertised_control(scheme, "cp.lab:8000", asked, proxy)
        assert e.value.code == "bad_request"
    else:
        assert trust.advertised_control(scheme, "cp.lab:8000", asked, proxy) == expected


@pytest.mark.parametrize("host,asked,proxy,public,expected", [
    # Reached on loopback behind the TLS proxy: the proxy is not on this port, so no https:// here.
    ("127.0.0.1:8000", None, True, None, "http://127.0.0.1:8000"),
    ("localhost:8000", None, True, None, "http://localhost:8000"),
    ("[::1]:8000", None, True, None, "http://[::1]:8000"),
    # The public address, from the setting or asked for (`cdui workers token --public-url`).
    ("127.0.0.1:8000", None, True, "https://codefyui.example.com", "https://codefyui.example.com"),
    ("127.0.0.1:8000", "https://codefyui.example.com/", False, "https://codefyui.example.com",
     "https://codefyui.example.com"),
    # A name the operator allowed as Host is the proxy's public name.
    ("127.0.0.1:8000", "https://cp.lab", True, None, "https://cp.lab"),
    ("127.0.0.1:8000", "https://cp.lab:8443", True, None, None),
    ("127.0.0.1:8000", "https://user@cp.lab", True, None, None),
    ("127.0.0.1:8000", "https://elsewhere.example", True, "https://codefyui.example.com", None),
])
def test_advertised_control_behind_the_proxy(host: str, asked: Any, proxy: bool, public: str | None,
                                             expected: str | None) -> None:
    if expected is None:
        with pytest.raises(CduiError) as e:
            trust.advertised_control("http", host, asked, proxy, public, ["cp.lab"])
        assert e.value.code == "bad_request"
    else:
        assert trust.advertised_control("http", host, asked, proxy, public, ["cp.lab"]) == expected


# -- a real nginx in front of a real control plane -----------------------------------------
class Nginx(Proc):
    """nginx running deploy/nginx/codefyui.conf on a loopback TLS port, in front of ``upstream``."""

    def __init__(self, exe: str, tmp: Path, upstream: int, cert: Cert) -> None:
        self.dir = tmp / "nginx"
        for sub in ("tls", "temp", "logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        site = NGINX_CONF.read_text()
        for old, new in (("listen 443 ssl;", f"listen 127.0.0.1:{self.port} ssl;"),
                         ("listen 80;", f"listen 127.0.0.1:{free_port()};"),
                         ("/etc/letsencrypt/live/codefyui.example.com/fullchain.pem", str(self.dir / "tls/cert.pem")),
                         ("/etc/letsencrypt/live/codefyui.example.com/privkey.pem", str(self.dir / "tls/key.pem")),
                         ("http://127.0.0.1:8000", f"http://127.0.0.1:{upstream}")):
            assert old in site, f"deploy/nginx/codefyui.conf no longer has {old!r}; update this test's edits"
            site = site.replace(old, new)
        (self.dir / "codefyui.conf").write_text(site)
        t = self.dir / "temp"
        (self.dir / "nginx.conf").write_text(
            ("user root;\n" if os.geteuid() == 0 else "")
            + f"worker_processes 1;\npid {self.dir}/nginx.pid;\nerror_log {self.dir}/logs/error.log info;\n"
            "events { worker_connections 128; }\n"
            f"http {{\n  access_log {self.dir}/logs/access.log;\n"
            f"  client_body_temp_path {t}/body; proxy_temp_path {t}/proxy; fastcgi_temp_path {t}/fastcgi;\n"
            f"  uwsgi_temp_path {t}/uwsgi; scgi_temp_path {t}/scgi;\n"
            f"  include {self.dir}/codefyui.conf;\n}}\n")
        self.use(cert)
        super().__init__([exe, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"), "-g", "daemon off;"],
                         dict(os.environ), self.dir / "logs" / "nginx.out", name="nginx")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def use(self, cert: Cert) -> None:
        shutil.copy(cert.cert, self.dir / "tls" / "cert.pem")
        shutil.copy(cert.key, self.dir / "tls" / "key.pem")
        self.cert = cert

    def start(self) -> Nginx:
        self.spawn()
        self.wait_presenting(self.cert)
        return self

    def swap(self, cert: Cert) -> None:
        """Serve another certificate (a reload, as `systemctl reload nginx` does), and wait until it is served."""
        self.use(cert)
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)
        self.wait_presenting(cert)

    def restart(self, cert: Cert) -> None:
        """Stop and start with another certificate: unlike a reload, this drops the open WebSockets."""
        self.stop()
        self.use(cert)
        self.start()

    def wait_presenting(self, cert: Cert) -> None:
        want = trust.spki_fingerprint(cert.der)

        def presented() -> bool:
            if not self.alive:
                raise AssertionError(f"nginx exited {self.returncode}: {self.log_tail()}\n{self.errors()}")
            return trust.presented_fingerprint("127.0.0.1", self.port, timeout=5) == want
        wait_for(presented, 60, 0.1, f"nginx to present {want}", detail=self.errors)

    def access_log(self) -> str:
        try:
            return (self.dir / "logs" / "access.log").read_text()
        except OSError:
            return ""

    def errors(self) -> str:
        try:
            return "\n".join((self.dir / "logs" / "error.log").read_text().splitlines()[-20:])
        except OSError:
            return ""


def agent_cmd(control: str, *extra: str, name: str = "w1") -> list[str]:
    return [sys.executable, "-m", "cdui", "agent", "start", "--control", control, "--name", name,
            "--devices", "cpu", *extra]


def agent_env(user_data: Path, ca: Path | None = None) -> dict[str, str]:
    env = env_for(user_data, user_data.parent / f"{user_data.name}-data", {"CODEFYUI_MACHINE_ID": "another-machine"})
    for k in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        env.pop(k, None)
    if ca is not None:
        env["SSL_CERT_FILE"] = str(ca)  # the worker's CA store: this test CA only
    return env


def run_agent(control: str, user_data: Path, *extra: str, ca: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`cdui agent start` that is expected to end by itself (a refused start)."""
    return subprocess.run(agent_cmd(control, *extra, "--foreground"), env=agent_env(user_data, ca), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


class AgentProc(Proc):
    def __init__(self, tmp: Path, user_data: Path, control: str, *extra: str, ca: Path | None = None,
                 name: str = "w1") -> None:
        self.user_data = user_data
        super().__init__(agent_cmd(control, *extra, "--foreground", name=name), agent_env(user_data, ca),
                         tmp / f"agent-{name}.log", name=f"agent-{name}")


def new_token(cp: ServerProc) -> str:
    return cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]


def uses_left(cp: ServerProc, tok: str) -> int:
    rows = cp.call("GET", "/api/workers/tokens", expect=200)
    return next(r["uses_left"] for r in rows if r["id"] == tok.split(".")[0])


def wait_online(cp: ServerProc, agent: Proc, name: str = "w1") -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        if not agent.alive:
            raise AssertionError(f"agent exited {agent.returncode}:\n{agent.log_tail(30)}")
        for w in cp.call("GET", "/api/workers", expect=200)["workers"]:
            if w["name"] == name and w["online"]:
                return w
        return None
    return wait_for(check, 120, 0.2, f"worker {name} online", detail=lambda: agent.log_tail(10))


def credential(user_data: Path, port: int) -> dict[str, Any]:
    return json.loads((user_data / "agent" / f"127.0.0.1-{port}.token").read_text())


@pytest.fixture(scope="module")
def nginx(need_command: Any) -> str:
    return need_command("nginx")


@pytest.fixture
def plane(tmp_path: Path):
    cp = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"}).start()
    yield cp
    cp.stop()


def iris_on_upload(cp: ServerProc) -> dict[str, Any]:
    """The iris example reading an uploaded CSV: its input is downloaded and its model uploaded
    by the worker through the proxy (the transfer backend)."""
    data = (REPO_ROOT / "data" / "samples" / "iris.csv").read_bytes()
    status, body = cp.upload("files", "train.csv", data)
    assert status == 201, body
    g = load_example()
    for n in g["nodes"]:
        if n["type"] == "CSVReader":
            n["data"]["params"]["path"] = "train.csv"
    return g


@pytest.mark.e2e
def test_acceptance_self_signed_proxy_pinned_with_the_documented_command(plane: ServerProc, certs: Certs, nginx: str,
                                                                         tmp_path: Path) -> None:
    """Through nginx with a self-signed certificate and the pin printed by the documented openssl command,
    an agent enrolls and runs a graph (its files cross the proxy too); the same agent with a wrong pin
    exits 2 before sending its token, at enrollment and with its stored credential."""
    proxy = Nginx(nginx, tmp_path, plane.port, certs.a).start()
    try:
        pin = documented_fingerprint(certs.a.cert)
        wrong = documented_fingerprint(certs.b.cert)
        ud = tmp_path / "agent-w1"
        # The owner's CLI, through the proxy with the pin, prints the exact command the agent needs.
        out = subprocess.run([sys.executable, "-m", "cdui", "workers", "token", "--control", proxy.url,
                              "--ca-fingerprint", pin], env=env_for(plane.user_data), cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        tok = out.stdout.splitlines()[0]
        assert out.stdout.splitlines()[-1] == (f"cdui agent start --control {proxy.url} --token {tok} "
                                               f"--ca-fingerprint {pin}")
        # The owner's other calls through the proxy take the pin too; a wrong pin is refused before anything is sent.
        for argv in (["api", "GET", "/api/health"], ["run", str(REPO_ROOT / "examples" / "iris_train.json")]):
            wrong_pin = subprocess.run([sys.executable, "-m", "cdui", *argv, "--control", proxy.url, "--ca-fingerprint",
                                        wrong], env=env_for(plane.user_data), cwd=REPO_ROOT, capture_output=True,
                                       text=True, timeout=120)
            assert wrong_pin.returncode == 1 and f"expected {wrong}" in wrong_pin.stderr, wrong_pin.stderr
        health = subprocess.run([sys.executable, "-m", "cdui", "api", "GET", "/api/health", "--control", proxy.url,
                                 "--ca-fingerprint", pin], env=env_for(plane.user_data), cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=120)
        assert health.returncode == 0 and json.loads(health.stdout)["status"] == "ok", health.stdout + health.stderr
        # nginx sets X-Forwarded-For: whoever reaches it never gets the session token, even from this host.
        boot = urllib.request.Request(proxy.url + "/api/auth/bootstrap")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(boot, timeout=60, context=ssl._create_unverified_context())  # noqa: S310
        assert refused.value.code == 403 and plane.token not in refused.value.read().decode()

        r = run_agent(proxy.url, ud, "--token", tok, "--ca-fingerprint", wrong)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"expected {wrong}" in r.stderr and f"the server presented {pin}" in r.stderr, r.stderr
        # The token never reached the server: still unused, and no HTTP request crossed the proxy.
        assert uses_left(plane, tok) == 1
        assert "/api/workers/enroll" not in proxy.access_log() and "enrolled" not in plane.log_text()
        assert not (ud / "agent" / f"127.0.0.1-{proxy.port}.token").exists()

        a = AgentProc(tmp_path, ud, proxy.url, "--token", tok, "--ca-fingerprint", pin)
        a.spawn()
        try:
            w = wait_online(plane, a)
            assert w["unencrypted"] is False, "the proxy reaches the control plane over loopback"
            assert credential(ud, proxy.port)["ca_fingerprint"] == pin, "the pin is stored with the credential"
            run = plane.submit(iris_on_upload(plane), {"target": {"worker": "w1"}})
            done = wait_run(plane, run["id"])
            assert done["status"] == "succeeded" and done["worker_id"] == "w1", done
            arts = plane.call("GET", f"/api/runs/{run['id']}/artifacts", expect=200)
            assert [x["backend"] for x in arts if x["relative_path"] == "models/iris/model.pt"] == ["transfer"], arts
        finally:
            assert a.stop() == 0
        assert "POST /api/runs/" in proxy.access_log(), "the model upload went through the proxy"

        before = proxy.access_log().count("/ws/worker")
        r = run_agent(proxy.url, ud, "--ca-fingerprint", wrong)
        assert r.returncode == 2, r.stdout + r.stderr
        # One line says it, on stderr, in the CLI's error shape (a journal shows each refusal once).
        assert [ln for ln in r.stderr.splitlines() if f"expected {wrong}" in ln and f"the server presented {pin}" in ln
                and ln.startswith("cdui: error: ")] != [] and r.stderr.count(f"expected {wrong}") == 1, r.stderr
        assert f"expected {wrong}" not in r.stdout, r.stdout
        assert proxy.access_log().count("/ws/worker") == before, "no WebSocket request carried the credential"
        assert credential(ud, proxy.port)["ca_fingerprint"] == pin, "a refused pin is not recorded"
    finally:
        proxy.stop()


@pytest.mark.e2e
def test_ca_trusted_certificate_needs_no_pin_and_token_answer_offers_one(certs: Certs, nginx: str,
                                                                       tmp_path: Path) -> None:
    """With the test CA in the worker's store and no pin: enrolls, connects, records nothing; an invalid stored
    pin is reported naming the file and ignored. The token answer through the proxy names the https address,
    the pin of CODEFYUI_TLS_CERT_FILE and the openssl command; a large upload passes the proxy."""
    cp = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1",
                                          "CODEFYUI_TLS_CERT_FILE": str(certs.fullchain)}).start()
    proxy = Nginx(nginx, tmp_path, cp.port, certs.leaf).start()
    try:
        leaf_pin = documented_fingerprint(certs.fullchain)
        ctx = ssl.create_default_context(cafile=str(certs.ca.cert))
        req = urllib.request.Request(proxy.url + "/api/workers/tokens", method="POST",
                                     data=json.dumps({"ttl_s": 3600, "uses": 1, "control": proxy.url}).encode(),
                                     headers={"X-CodefyUI-Token": cp.token, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=60) as resp:
            answer = json.loads(resp.read())
        assert answer["ca_fingerprint"] == leaf_pin
        assert answer["command"] == (f"cdui agent start --control {proxy.url} --token {answer['token']} "
                                     f"--ca-fingerprint {leaf_pin}")
        assert answer["fingerprint_command"] == trust.openssl_command(str(certs.fullchain))

        # A file over nginx's default 1 MiB body limit: the site's client_max_body_size applies.
        big = os.urandom(3 * 1024 * 1024)
        boundary = "cduiboundary"
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + big + f"\r\n--{boundary}--\r\n".encode()
        up = urllib.request.Request(proxy.url + "/api/files/upload", method="POST", data=body,
                                    headers={"X-CodefyUI-Token": cp.token,
                                             "Content-Type": f"multipart/form-data; boundary={boundary}"})
        with urllib.request.urlopen(up, context=ctx, timeout=120) as resp:
            assert resp.status == 201

        ud = tmp_path / "agent-w1"
        a = AgentProc(tmp_path, ud, proxy.url, "--token", answer["token"], ca=certs.ca.cert)
        a.spawn()
        try:
            wait_online(cp, a)
            assert "ca_fingerprint" not in credential(ud, proxy.port), "CA mode records nothing"
        finally:
            assert a.stop() == 0
        path = ud / "agent" / f"127.0.0.1-{proxy.port}.token"
        path.write_text(json.dumps({**credential(ud, proxy.port), "ca_fingerprint": "sha256:not-a-pin"}))
        a = AgentProc(tmp_path, ud, proxy.url, ca=certs.ca.cert)
        a.spawn()
        try:
            wait_online(cp, a)
            assert f"{path}: its ca_fingerprint 'sha256:not-a-pin' is not a valid fingerprint" in a.log_text()
        finally:
            a.stop()
    finally:
        proxy.stop()
        cp.stop()


@pytest.mark.e2e
def test_pinned_key_changed_refused_then_new_pin_keeps_the_credential(plane: ServerProc, certs: Certs, nginx: str,
                                                                      tmp_path: Path) -> None:
    proxy = Nginx(nginx, tmp_path, plane.port, certs.a).start()
    try:
        old, new = documented_fingerprint(certs.a.cert), documented_fingerprint(certs.b.cert)
        ud = tmp_path / "agent-w1"
        a = AgentProc(tmp_path, ud, proxy.url, "--token", new_token(plane), "--ca-fingerprint", old)
        a.spawn()
        try:
            wait_online(plane, a)
        finally:
            a.stop()
        kept = credential(ud, proxy.port)
        proxy.swap(certs.b)  # the proxy got a new key

        r = run_agent(proxy.url, ud)
        assert r.returncode == 2, r.stdout + r.stderr
        out = r.stdout + r.stderr
        assert f"expected {old} (stored in {ud / 'agent'}" in out and f"the server presented {new}" in out, out
        assert credential(ud, proxy.port) == kept

        # As the operator types it: a background start, which waits until its agent connected.
        env = agent_env(ud)
        r = subprocess.run([sys.executable, "-m", "cdui", "agent", "start", "--control", proxy.url,
                            "--ca-fingerprint", new], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=120)
        try:
            assert r.returncode == 0 and "connected to" in r.stdout, r.stdout + r.stderr
            wait_for(lambda: credential(ud, proxy.port).get("ca_fingerprint") == new, 60, 0.1,
                     "the new pin recorded after the connection")
            assert credential(ud, proxy.port) == {**kept, "ca_fingerprint": new}, "same credential, new pin"
        finally:
            stop = subprocess.run([sys.executable, "-m", "cdui", "agent", "stop"], env=env, cwd=REPO_ROOT,
                                  capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        # Later starts reuse the recorded pin without the flag.
        a = AgentProc(tmp_path, ud, proxy.url)
        a.spawn()
        try:
            wait_online(plane, a)
        finally:
            a.stop()
    finally:
        proxy.stop()


def test_next_pin_lets_the_rotated_key_through_and_then_becomes_the_pin(certs: Certs, tmp_path: Path) -> None:
    old, new = trust.spki_fingerprint(certs.a.der), trust.spki_fingerprint(certs.b.der)
    t = trust.Trust(old, "stored", new)
    t.check(certs.a.der, "cp:443")
    assert t.verified == old
    t.check(certs.b.der, "cp:443")
    assert t.verified == new
    with pytest.raises(trust.PinMismatch) as e:
        trust.Trust(old, "stored", new).check(certs.leaf.der, "cp:443")
    assert f"expected {old} (stored; next pin {new})" in str(e.value)
    # Only a next pin (a worker that never pinned before the rotation's first step) pins too.
    trust.Trust(None, "stored", new).check(certs.b.der, "cp:443")
    cred = tmp_path / "cp-443.token"
    cred.write_text(json.dumps({"credential": "c", trust.CREDENTIAL_KEY: old}))
    trust.record_next_pin(cred, new)
    t = trust.Trust(old, f"stored in {cred}", None, cred)
    t.reload()
    assert (t.pin, t.next_pin) == (old, new)
    # Once the next key was seen it is the pin, and the next pin is used up.
    assert trust.record_pin(cred, new) is True
    assert json.loads(cred.read_text()) == {"credential": "c", trust.CREDENTIAL_KEY: new}


@pytest.mark.e2e
def test_key_rotation_with_a_next_pin_strands_no_worker(plane: ServerProc, certs: Certs, nginx: str,
                                                        tmp_path: Path) -> None:
    """The documented rotation: the next key is pinned on the worker while its agent runs, the workers list
    shows it held, the proxy switches keys, and the agent reconnects to the new key without a restart; the
    list shows which pin it verified, and the new key is its pin from then on."""
    proxy = Nginx(nginx, tmp_path, plane.port, certs.a).start()
    try:
        old, new = documented_fingerprint(certs.a.cert), documented_fingerprint(certs.b.cert)
        ud = tmp_path / "agent-w1"
        a = AgentProc(tmp_path, ud, proxy.url, "--token", new_token(plane), "--ca-fingerprint", old)
        a.spawn()
        try:
            w = wait_online(plane, a)
            assert (w["tls_pin"], w["tls_next_pin"]) == (old, None), w
            r = subprocess.run([sys.executable, "-m", "cdui", "agent", "pin", proxy.url, "--next", new],
                               env=agent_env(ud), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr

            def shown() -> dict[str, Any] | None:
                w = next(x for x in plane.call("GET", "/api/workers", expect=200)["workers"] if x["name"] == "w1")
                return w if w["online"] else None
            wait_for(lambda: (shown() or {}).get("tls_next_pin") == new, 60, 0.2, "the next pin shown")
            proxy.restart(certs.b)  # the new key; the restart drops the agent's connection
            # Its next heartbeat says the next pin is used up: the new key is the pin now.
            wait_for(lambda: (x := shown()) and (x["tls_pin"], x["tls_next_pin"]) == (new, None), 120, 0.2,
                     "the worker back on the new key", detail=lambda: a.log_tail(10))
            assert a.alive, a.log_tail(20)
            assert credential(ud, proxy.port)[trust.CREDENTIAL_KEY] == new
            assert trust.NEXT_KEY not in credential(ud, proxy.port)
        finally:
            assert a.stop() == 0
    finally:
        proxy.stop()


@pytest.mark.e2e
def test_untrusted_unpinned_enrollment_fails_and_a_running_agent_retries_until_fixed(
        plane: ServerProc, certs: Certs, nginx: str, tmp_path: Path) -> None:
    proxy = Nginx(nginx, tmp_path, plane.port, certs.a).start()
    try:
        presented = documented_fingerprint(certs.a.cert)
        tok = new_token(plane)
        r = run_agent(proxy.url, tmp_path / "agent-w2", "--token", tok, ca=certs.ca.cert)
        assert r.returncode == 4, r.stdout + r.stderr
        assert "is not trusted" in r.stderr and f"presented the key {presented}" in r.stderr, r.stderr
        assert uses_left(plane, tok) == 1, "the token was not sent"

        proxy.swap(certs.leaf)  # CA-signed: enrollment works in CA mode
        ud = tmp_path / "agent-w1"
        a = AgentProc(tmp_path, ud, proxy.url, "--token", tok, ca=certs.ca.cert)
        a.spawn()
        try:
            wait_online(plane, a)
            proxy.restart(certs.a)  # a misconfigured proxy: a certificate nobody trusts
            wait_for(lambda: a.log_text().count("is not trusted") >= 2, 120, 0.1, "two refused connections",
                     detail=lambda: a.log_tail(10))
            log = a.log_text()
            assert log.count(f"presented the key {presented}") == 1, "the first report names the key, once"
            proxy.restart(certs.leaf)  # fixed: the agent comes back without a restart
            wait_for(lambda: a.log_text().count("connected to ") >= 2, 120, 0.1, "the agent reconnected",
                     detail=lambda: a.log_tail(10))
            wait_online(plane, a)
            assert a.alive
        finally:
            a.stop()
    finally:
        proxy.stop()


# -- plain HTTP to another machine ------------------------------------------------------------
@dataclass
class Lan:
    netns: list[str]  # prefix that runs a command on the "other machine"
    server: str  # this machine's address on the link
    agent: str  # the other machine's address


@pytest.fixture
def lan(need_command: Any):
    """Another machine on a private link the test owns: a network namespace joined by a veth pair
    (10.213.N.1 here, 10.213.N.2 there); nothing outside this machine is reachable or reached."""
    ip = need_command("ip", "iproute2")
    tag = f"{os.getpid() % 100000}"
    ns, here, there = f"cdui-t{tag}", f"cdv{tag}a", f"cdv{tag}b"
    n = os.getpid() % 250 + 1
    server, agent = f"10.213.{n}.1", f"10.213.{n}.2"
    made = subprocess.run([ip, "netns", "add", ns], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace here ({made.stderr.strip()}); needs root or CAP_SYS_ADMIN")
    try:
        for cmd in (["link", "add", here, "type", "veth", "peer", "name", there],
                    ["link", "set", there, "netns", ns],
                    ["addr", "add", f"{server}/30", "dev", here], ["link", "set", here, "up"],
                    ["netns", "exec", ns, ip, "addr", "add", f"{agent}/30", "dev", there],
                    ["netns", "exec", ns, ip, "link", "set", there, "up"],
                    ["netns", "exec", ns, ip, "link", "set", "lo", "up"]):
            subprocess.run([ip, *cmd], check=True, capture_output=True, text=True)
        yield Lan([ip, "netns", "exec", ns], server, agent)
    finally:
        subprocess.run([ip, "link", "del", here], capture_output=True)
        subprocess.run([ip, "netns", "del", ns], capture_output=True)


class LanServer(ServerProc):
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@pytest.mark.e2e
def test_http_to_another_machine_warns_once_and_is_marked(lan: Lan, tmp_path: Path) -> None:
    """An agent in another network namespace reaches the control plane over plain HTTP: one warning,
    and the worker is listed as unencrypted (by its peer address; loopback peers never are)."""
    cp = LanServer(tmp_path, host=lan.server, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"}).start()
    try:
        a = AgentProc(tmp_path, tmp_path / "agent-w1", cp.url, "--token", new_token(cp))
        a.cmd = lan.netns + a.cmd
        a.spawn()
        try:
            w = wait_online(cp, a)
            assert w["unencrypted"] is True and w["address"] == lan.agent, w
            assert a.log_text().count("is unencrypted HTTP") == 1, a.log_text()
            r = subprocess.run([sys.executable, "-m", "cdui", "workers", "list", "--control", cp.url],
                               env=env_for(cp.user_data), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
            assert "[unencrypted HTTP]" in r.stdout, r.stdout + r.stderr
        finally:
            a.stop()
    finally:
        cp.stop()
