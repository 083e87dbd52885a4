"""Token answers and the proxy certificate, in process: which address and pin a generated
agent command names, and that a bad ``control`` stores nothing."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from harness import Plane

from cdui.core import trust


def _cert(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", "k.pem", "-out", "fullchain.pem", "-days", "2", "-subj", "/CN=cp.lab"],
                   cwd=d, check=True, capture_output=True, timeout=120)
    return d / "fullchain.pem"


async def test_certificate_file_pins_generated_commands(dirs: dict[str, Path], tmp_path: Path,
                                                        need_command: Any) -> None:
    need_command("openssl")
    pem = _cert(tmp_path / "tls")
    fp = trust.spki_fingerprint(trust.pem_leaf_der(pem.read_text()))
    async with Plane(dirs["user_data"], dirs["data_dir"], CODEFYUI_TLS_CERT_FILE=str(pem),
                     CODEFYUI_EXTRA_ALLOWED_HOSTS="cp.lab") as cp:
        host = cp.url.split("://", 1)[1]
        assert cp.session is not None
        # Through the proxy (its public name as Host): workers use the https:// address, pinned.
        async with cp.session.post(cp.url + "/api/workers/tokens", json={"ttl_s": 60, "uses": 1},
                                   headers={"Host": "cp.lab"}) as r:
            assert r.status == 201, await r.text()
            t = await r.json()
        assert t["command"] == f"cdui agent start --control https://cp.lab --token {t['token']} --ca-fingerprint {fp}"
        assert t["ca_fingerprint"] == fp and t["fingerprint_command"] == trust.openssl_command(str(pem))
        assert "note" not in t
        # On the control plane's own loopback port nothing speaks TLS: no https:// there, and the note
        # names the proxy's address, never --host 0.0.0.0 (which the proxy deployment forbids).
        t = await cp.call("POST", "/api/workers/tokens", {"ttl_s": 60, "uses": 1}, expect=201)
        assert t["command"] == f"cdui agent start --control http://{host} --token {t['token']}"
        assert "--public-url https://NAME" in t["note"] and "0.0.0.0" not in t["note"]
        # The public name asked for (`cdui workers token --public-url`) from loopback.
        t = await cp.call("POST", "/api/workers/tokens", {"ttl_s": 60, "uses": 1, "control": "https://cp.lab"},
                          expect=201)
        assert t["command"] == f"cdui agent start --control https://cp.lab --token {t['token']} --ca-fingerprint {fp}"
        # The client's own origin decides the scheme; plain HTTP gets no pin.
        t = await cp.call("POST", "/api/workers/tokens", {"ttl_s": 60, "uses": 1, "control": f"http://{host}"},
                          expect=201)
        assert t["command"] == f"cdui agent start --control http://{host} --token {t['token']}"
        assert "ca_fingerprint" not in t and "fingerprint_command" not in t
        await cp.call("POST", "/api/workers/enroll", {"token": t["token"], "name": "w1"}, expect=201)
        r = await cp.call("POST", "/api/workers/w1/reissue", {"control": f"https://{host}"}, expect=201)
        assert r["command"] == (f"cdui agent start --control https://{host} --token {r['token']} --name w1 "
                                f"--ca-fingerprint {fp}")
        before = await cp.call("GET", "/api/workers/tokens")
        status, body = await cp.api("POST", "/api/workers/tokens", {"ttl_s": 60, "uses": 1,
                                                                     "control": "https://elsewhere.example"})
        assert status == 400 and body["error"]["code"] == "bad_request", body
        assert await cp.call("GET", "/api/workers/tokens") == before, "a refused request stores no token"


async def test_public_url_setting_names_the_address_for_loopback_callers(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"],
                     CODEFYUI_PUBLIC_URL="https://codefyui.example.com/") as cp:
        t = await cp.call("POST", "/api/workers/tokens", {"ttl_s": 60, "uses": 1}, expect=201)
        assert t["command"] == f"cdui agent start --control https://codefyui.example.com --token {t['token']}"
        assert "note" not in t and "fingerprint_command" in t


async def test_without_certificate_file_https_origin_gets_the_openssl_command(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as cp:
        host = cp.url.split("://", 1)[1]
        t = await cp.call("POST", "/api/workers/tokens", {"ttl_s": 60, "uses": 1}, expect=201)
        assert t["command"] == f"cdui agent start --control http://{host} --token {t['token']}"
        assert "fingerprint_command" not in t
        t = await cp.call("POST", "/api/workers/tokens", {"ttl_s": 60, "uses": 1, "control": f"https://{host}"},
                          expect=201)
        assert t["command"] == f"cdui agent start --control https://{host} --token {t['token']}"
        assert t["fingerprint_command"] == trust.openssl_command() and "ca_fingerprint" not in t
