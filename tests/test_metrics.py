"""GET /metrics on a real control plane with a real agent, and a real Prometheus server scraping it.

One server and one worker (w1) for the module: the series are read as the queue, the worker and the
runs change, the readers of /metrics are checked (the session token, the metrics token, loopback),
and Debian's Prometheus scrapes it with the metrics token and evaluates deploy/prometheus's alert
rules on what it scraped. The rules and the scrape config are also checked with promtool."""
from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from procs import Proc, ServerProc, csv_print_graph, env_for, free_port, wait_for, wait_run

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "prometheus"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProc, str]]:
    tmp = tmp_path_factory.mktemp("metrics")
    token = secrets.token_hex(24)
    (tmp / "metrics-token").write_text(token + "\n")
    s = ServerProc(tmp, extra_env={"CODEFYUI_METRICS_TOKEN_FILE": str(tmp / "metrics-token"),
                                   "CODEFYUI_WORKER_HEARTBEAT_S": "2"})
    s.start()
    enroll = s.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
    agent = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", s.url, "--name", "w1",
                  "--devices", "cpu", "--foreground", "--token", enroll],
                 env_for(tmp / "agent-w1", tmp / "agent-w1-data"), tmp / "agent-w1.log", name="agent-w1")
    agent.spawn()
    try:
        wait_for(lambda: any(w["online"] for w in s.call("GET", "/api/workers")["workers"]), 120, 0.2,
                 "worker w1 online", detail=agent.log_tail)
        yield s, token
    finally:
        agent.stop()
        s.stop()


def scrape(s: ServerProc, **headers: str) -> Samples:
    r = s.raw("GET", "/metrics", token=False, headers=headers)
    assert r.status == 200, (r.status, r.body[:300])
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers
    out: Samples = {}
    for fam in text_string_to_metric_families(r.body.decode()):
        for smp in fam.samples:
            out[(smp.name, frozenset(smp.labels.items()))] = smp.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.mark.e2e
def test_metrics_show_the_queue_the_worker_and_the_runs(plane: tuple[ServerProc, str]) -> None:
    s, _ = plane
    s.call("POST", "/api/workers/w1/drain", {})
    run = s.submit(csv_print_graph(), {"target": {"worker": "w1"}})
    status, _ = s.api("POST", "/api/workers/enroll", {"token": "abcdef.0123456789abcdef", "name": "x"}, token=False)
    assert status == 401

    m = scrape(s)
    assert value(m, "cdui_queue_depth", target="worker/w1") == 1, m
    assert (value(m, "cdui_queue_oldest_age_seconds", target="worker/w1") or -1) >= 0
    assert value(m, "cdui_workers", state="draining") == 1
    assert value(m, "cdui_workers", state="online") == 0
    assert value(m, "cdui_worker_online", worker="w1") == 1
    assert value(m, "cdui_runs", status="queued", target="worker/w1") == 1
    assert value(m, "cdui_enrollment_refusals_total", reason="token_unknown") == 1
    assert value(m, "cdui_enrollment_refusals_total", reason="bad_token") == 0
    assert (value(m, "cdui_worker_heartbeat_age_seconds", worker="w1") or -1) >= 0
    assert value(m, "cdui_worker_slots", worker="w1", device="cpu") == 1
    assert value(m, "cdui_disk_full") == 0

    s.call("POST", "/api/workers/w1/undrain", {})
    assert wait_run(s, run["id"])["status"] == "succeeded"

    def settled() -> Samples | None:
        # The ending is stored before its slot is freed and its duration counted, on the server's loop.
        m = scrape(s)
        done = value(m, "cdui_run_duration_seconds_count", status="succeeded") == 1
        return m if done and value(m, "cdui_worker_slots_in_use", worker="w1", device="cpu") == 0 else None
    m = wait_for(settled, 60, 0.2, "the run's end to be counted", detail=lambda: scrape(s))
    assert value(m, "cdui_queue_depth", target="worker/w1") is None, "an empty queue has no series"
    assert value(m, "cdui_workers", state="online") == 1
    assert value(m, "cdui_runs", status="succeeded", target="worker/w1") == 1
    assert value(m, "cdui_worker_slots_in_use", worker="w1", device="cpu") == 0
    assert value(m, "cdui_dispatch_latency_seconds_count") == 1
    assert value(m, "cdui_run_duration_seconds_count", status="succeeded") == 1
    assert value(m, "cdui_run_duration_seconds_bucket", status="succeeded", le="+Inf") == 1
    assert (value(m, "cdui_events_written_total") or 0) >= len(s.events(run["id"]))
    assert (value(m, "cdui_database_size_bytes") or 0) > 0
    assert value(m, "cdui_database_wal_size_bytes") is not None
    assert (value(m, "cdui_user_data_free_bytes") or 0) > 0
    assert (value(m, "cdui_user_data_size_bytes") or 0) >= (value(m, "cdui_user_data_free_bytes") or 0)
    assert value(m, "cdui_event_loop_lag_seconds") is not None
    assert value(m, "cdui_transfer_received_bytes_total") == 0
    # Names and labels as Prometheus wants them, and bounded: never a run id.
    assert all(name.startswith("cdui_") for name, _ in m), sorted({n for n, _ in m})
    assert not any(run["id"] in v for _, labels in m for _, v in labels)


@pytest.mark.e2e
def test_metrics_readers(plane: tuple[ServerProc, str]) -> None:
    """Loopback reads it without a token; through a proxy it takes the metrics token or the session token,
    and the metrics token opens nothing else."""
    s, token = plane
    proxied = {"X-Forwarded-For": "203.0.113.9"}
    r = s.raw("GET", "/metrics", token=False, headers=proxied)
    assert r.status == 401, r.status
    err = r.json()["error"]
    assert "needs a token" in err["message"] and "Authorization: Bearer" in err["hint"], err
    assert s.raw("GET", "/metrics", token=False, headers={**proxied, "Authorization": "Bearer " + "x" * 48}
                 ).status == 401
    assert "cdui_workers" in scrape(s, **proxied, Authorization=f"Bearer {token}").__repr__()
    assert s.raw("GET", "/metrics", token=True, headers=proxied).status == 200
    assert s.raw("GET", "/api/runs", token=False, headers={"Authorization": f"Bearer {token}"}).status == 401


def test_promtool_checks_the_deployed_rules_and_config(tmp_path: Path) -> None:
    """deploy/prometheus: the rules pass `promtool check rules` and their unit tests (each alert fires on
    what should fire it), and the scrape config `promtool check config` (its token file made here)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is missing (apt-get install prometheus; .ci/run installs it)")
    for argv in (["check", "rules", "cdui-alerts.yml"], ["test", "rules", "cdui-alerts.test.yml"]):
        r = subprocess.run([promtool, *argv], cwd=DEPLOY, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    (tmp_path / "token").write_text("t" * 32)
    shutil.copy(DEPLOY / "cdui-alerts.yml", tmp_path)
    (tmp_path / "prometheus.yml").write_text((DEPLOY / "prometheus.yml").read_text().replace(
        "/etc/prometheus/cdui-metrics-token", str(tmp_path / "token")))
    r = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 6 rules found" in r.stdout, r.stdout


def prom_query(url: str, query: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.mark.e2e
def test_prometheus_scrapes_the_control_plane(plane: tuple[ServerProc, str], tmp_path: Path) -> None:
    """Debian's Prometheus scrapes the server with the metrics token (as deploy/prometheus does) and
    evaluates the deployed alert rules on what it scraped."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("the prometheus server is missing (apt-get install prometheus; .ci/run installs it)")
    s, token = plane
    (tmp_path / "token").write_text(token)
    shutil.copy(DEPLOY / "cdui-alerts.yml", tmp_path)
    config = (DEPLOY / "prometheus.yml").read_text()
    config = (config.replace("/etc/prometheus/cdui-metrics-token", str(tmp_path / "token"))
              .replace("cdui.example.lan:8000", s.url.removeprefix("http://"))
              .replace("scrape_interval: 30s", "scrape_interval: 1s")
              .replace("evaluation_interval: 30s", "evaluation_interval: 1s"))
    (tmp_path / "prometheus.yml").write_text(config)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    prom = Proc([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"], env_for(tmp_path / "unused"), tmp_path / "prometheus.log",
                name="prometheus")
    prom.spawn()
    try:
        def online() -> list[dict[str, Any]] | None:
            try:
                res = prom_query(url, 'cdui_worker_online{job="cdui"}')
            except OSError:
                return None
            return res or None
        res = wait_for(online, 120, 0.5, "Prometheus to scrape cdui_worker_online", detail=prom.log_tail)
        assert [(r["metric"]["worker"], r["value"][1]) for r in res] == [("w1", "1")], res
        assert prom_query(url, 'up{job="cdui"}')[0]["value"][1] == "1"
        assert prom_query(url, 'cdui_workers{state="online"}')[0]["value"][1] == "1"
        assert prom_query(url, "cdui_user_data_free_bytes")[0]["value"][1] != "0"

        def rules_evaluated() -> list[dict[str, Any]] | None:
            with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=10) as r:
                groups = json.loads(r.read())["data"]["groups"]
            rules = [rule for g in groups for rule in g["rules"]]
            return rules if rules and all(rule.get("lastEvaluation", "").startswith("2") and
                                          not rule["lastEvaluation"].startswith("0001") for rule in rules) else None
        rules = wait_for(rules_evaluated, 120, 0.5, "Prometheus to evaluate the cdui rules", detail=prom.log_tail)
        assert {r["name"] for r in rules} == {"CduiDown", "CduiNoWorkerOnline", "CduiQueueStuck", "CduiDiskNearlyFull",
                                              "CduiDiskFull", "CduiEventLoopLag"}
        assert all(r["health"] == "ok" for r in rules), rules
        assert [r["name"] for r in rules if r["state"] != "inactive"] == [], "a healthy control plane fires nothing"
    finally:
        prom.stop()
