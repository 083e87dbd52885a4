"""deploy/k8s and deploy/container, checked offline: no cluster can run here.

Every overlay renders with `kubectl kustomize`, what it renders passes the Kubernetes API's own
schemas (kubernetes-validate, strict: an unknown or misspelt field fails), and `kubectl apply
--dry-run=client --validate=false` takes it (against a discovery answerer, since even a client dry
run asks an API server which kinds exist). The pods' commands are
parsed by cdui's own argument parser, their CODEFYUI_* settings loaded by cdui's config, and their
folders checked against their volumes, so a flag renamed in the CLI or a setting dropped breaks this
test rather than a lab's cluster. The Containerfile is linted with hadolint."""
from __future__ import annotations

import argparse
import http.server
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdui.agent.instances import ID_RE
from cdui.cli.cli import build_parser
from cdui.core import config
from cdui.plane.enroll import NAME_RE

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
# The oldest Kubernetes the manifests are for: backoffLimitPerIndex (the one-shot Job) is there from 1.29.
KUBERNETES_VERSION = "1.29.0"
# What the downward API gives a pod of the one-shot Job (its job-name label, its completion index).
JOB_POD_FIELDS = {"metadata.labels['job-name']": "cdui-oneshot",
                  "metadata.annotations['batch.kubernetes.io/job-completion-index']": "3",
                  "metadata.name": "cdui-agent-6d4cf56db6-x7k2p"}


def tool(name: str) -> str:
    """The test environment's own copy (the test extra installs kubectl and hadolint as wheels), else PATH's."""
    own = Path(sys.executable).parent / name
    found = str(own) if own.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is missing (the test extra installs it: bin/cdui test --version)")
    return found


def render(overlay: str) -> list[dict[str, Any]]:
    r = subprocess.run([tool("kubectl"), "kustomize", str(K8S / "overlays" / overlay)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in a command or an env value: defined names only."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def pod_env(container: dict[str, Any]) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """The container's env as the kubelet makes it (values in order, each expanding the earlier ones),
    and the entries that come from elsewhere (Secrets), by name."""
    env: dict[str, str] = {}
    refs: dict[str, dict[str, Any]] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
        elif "fieldRef" in e["valueFrom"]:
            env[e["name"]] = JOB_POD_FIELDS[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            refs[e["name"]] = e["valueFrom"]
    return env, refs


def argv_of(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    argv = [expand(a, env) for a in container.get("command", []) + container.get("args", [])]
    unexpanded = [a for a in argv if "$(" in a]
    assert unexpanded == [], f"names no env entry defines: {unexpanded}"
    assert argv[0] == "cdui", argv
    return argv


def parse(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        raise AssertionError(f"cdui's parser refused {argv}") from exc


def token_env() -> str:
    """The environment variable `cdui agent start` reads the enrollment token from, as its --token help says."""
    agent_start = build_parser()._subparsers._group_actions[0].choices["agent"]  # type: ignore[union-attr]
    start = agent_start._subparsers._group_actions[0].choices["start"]
    help_text = next(a.help for a in start._actions if "--token" in a.option_strings)
    m = re.search(r"\b(CODEFYUI_[A-Z_]+)\b", help_text or "")
    assert m, help_text
    return m.group(1)


def check_settings(env: dict[str, str], refs: dict[str, dict[str, Any]]) -> None:
    """Every CODEFYUI_* entry is a setting cdui knows (or the token the agent reads), and its value loads."""
    known = {s.name for s in config.SETTINGS} | {token_env()}
    unknown = [n for n in [*env, *refs] if n.startswith("CODEFYUI_") and n not in known]
    assert unknown == [], f"settings cdui does not read: {unknown}"
    config.load({k: v for k, v in env.items() if k.startswith("CODEFYUI_")})


def mounted(pod: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The pod volume holding ``path`` in the container."""
    mounts = [m for m in container.get("volumeMounts", []) if path == m["mountPath"]
              or path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"{path} is on no volume of {container['name']}"
    name = max(mounts, key=lambda m: len(m["mountPath"]))["name"]
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    assert name in vols, f"volume {name} is mounted but not defined"
    return vols[name]


def test_every_overlay_renders_and_passes_the_api_schemas(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    import kubernetes_validate  # noqa: PLC0415  (a test-only dependency, needed here only)
    _, docs = rendered
    assert {d["kind"] for d in docs} >= {"Namespace", "StatefulSet", "Service", "Ingress", "Deployment", "Job",
                                         "PersistentVolumeClaim"}
    for d in docs:
        kubernetes_validate.validate(d, KUBERNETES_VERSION, strict=True)
        assert d["metadata"].get("namespace", "cdui") == "cdui"


# The API groups and kinds the manifests may use, as a Kubernetes API server's discovery lists them: what
# `kubectl apply --dry-run=client` asks before it prints anything (kind -> (group version, plural, namespaced)).
API_KINDS = {"Namespace": ("v1", "namespaces", False), "Service": ("v1", "services", True),
             "PersistentVolumeClaim": ("v1", "persistentvolumeclaims", True),
             "StatefulSet": ("apps/v1", "statefulsets", True), "Deployment": ("apps/v1", "deployments", True),
             "Job": ("batch/v1", "jobs", True), "Ingress": ("networking.k8s.io/v1", "ingresses", True)}


class Discovery(http.server.BaseHTTPRequestHandler):
    """An API server's discovery answers (API_KINDS) and 404 for every object: no cluster holds any yet."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        versions = sorted({gv for gv, _, _ in API_KINDS.values() if "/" in gv})
        resources = {gv: [{"name": plural, "singularName": kind.lower(), "namespaced": ns, "kind": kind,
                           "verbs": ["create", "delete", "get", "list", "patch", "update"]}
                          for kind, (g, plural, ns) in API_KINDS.items() if g == gv] for gv in ["v1", *versions]}
        body: dict[str, Any]
        if path == "/api":
            body = {"kind": "APIVersions", "versions": ["v1"]}
        elif path == "/apis":
            body = {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                 "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}} for gv in versions]}
        elif path == "/api/v1" or path.removeprefix("/apis/") in versions:
            gv = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
            body = {"kind": "APIResourceList", "groupVersion": gv, "resources": resources[gv]}
        else:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
        data = json.dumps(body).encode()
        self.send_response(body.get("code", 200))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_kubectl_apply_dry_run_accepts_every_overlay(rendered: tuple[str, list[dict[str, Any]]],
                                                      tmp_path: Path) -> None:
    """`kubectl apply --dry-run=client --validate=false` takes the rendered overlay, every object "created
    (dry run)". Even a client dry run asks an API server which kinds exist, so it asks a discovery
    answerer of the API's real groups and kinds here: a kind the API lacks is refused."""
    overlay, docs = rendered
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Discovery)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "kubeconfig").write_text("")
        text = yaml.safe_dump_all(docs)
        r = subprocess.run([tool("kubectl"), "--kubeconfig", str(tmp_path / "kubeconfig"), "--server",
                            f"http://127.0.0.1:{server.server_port}", "apply", "--dry-run=client", "--validate=false",
                            "-f", "-"], input=text, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0, r.stderr
    created = [line for line in r.stdout.splitlines() if line.endswith(" created (dry run)")]
    assert len(created) == len(docs), (overlay, r.stdout)


def test_the_one_shot_job_runs_what_one_shot_agents_need(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, docs = rendered
    job = one(docs, "Job", "cdui-oneshot")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] >= 1
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never", "a pod that took its run must not take another"
    (container,) = pod["containers"]
    env, refs = pod_env(container)
    args = parse(argv_of(container, env))
    assert (args.command, args.agent_command, args.one_shot) == ("agent", "start", True)
    # Each pod its own instance: the Job's name and the pod's completion index, a valid instance ID.
    assert args.instance == "cdui-oneshot-3" and ID_RE.match(args.instance), args.instance
    assert NAME_RE.match(args.name), args.name
    assert args.token is None, "the token never goes on the command line"
    assert refs[token_env()]["secretKeyRef"] == {"name": "cdui-enroll", "key": "token"}
    check_settings(env, refs)
    # --control is the control plane's Service.
    service = one(docs, "Service", "cdui")
    assert args.control in {f"http://{service['metadata']['name']}:{p['port']}" for p in service["spec"]["ports"]}
    # The instances share one credential: their user data folder is one ReadWriteMany claim; the runs'
    # files are the pod's own.
    shared = mounted(pod, container, env["CODEFYUI_USER_DATA_DIR"])
    claim = one(docs, "PersistentVolumeClaim", shared["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "emptyDir" in mounted(pod, container, env["CODEFYUI_DATA_DIR"])
    gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
    assert gpus == (1 if overlay == "gpu" else None), (overlay, container["resources"])


def test_the_agent_deployment_names_each_worker_after_its_pod(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, docs = rendered
    pod = one(docs, "Deployment", "cdui-agent")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert any(e["name"] == "CDUI_WORKER_NAME" and e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
               for e in container["env"])
    env, refs = pod_env(container)
    args = parse(argv_of(container, env))
    assert (args.agent_command, args.one_shot, args.foreground) == ("start", False, True)
    assert args.name == JOB_POD_FIELDS["metadata.name"] and NAME_RE.match(args.name)
    assert refs[token_env()]["secretKeyRef"]["name"] == "cdui-enroll"
    check_settings(env, refs)
    mounted(pod, container, env["CODEFYUI_USER_DATA_DIR"])
    assert (container["resources"].get("limits", {}).get("nvidia.com/gpu") == 1) == (overlay == "gpu")


def test_the_control_plane_keeps_its_state_and_is_probed_on_health(rendered: tuple[str, list[dict[str, Any]]]
                                                                    ) -> None:
    import cdui.plane.server  # noqa: PLC0415  (its routes, read as the docs test reads them)
    _, docs = rendered
    sts = one(docs, "StatefulSet", "cdui")
    assert sts["spec"]["replicas"] == 1, "one writer of the sqlite database"
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env, refs = pod_env(container)
    args = parse(argv_of(container, env))
    assert (args.command, args.foreground, args.host) == ("start", True, "0.0.0.0")
    port = args.port
    assert [p["containerPort"] for p in container["ports"]] == [port]
    check_settings(env, refs)
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    for folder in (env["CODEFYUI_USER_DATA_DIR"], env["CODEFYUI_DATA_DIR"]):
        mounts = [m["name"] for m in container["volumeMounts"] if folder.startswith(m["mountPath"].rstrip("/") + "/")]
        assert mounts and mounts[0] in claims, f"{folder} is not on the persistent volume"
    metrics = mounted(pod, container, env["CODEFYUI_METRICS_TOKEN_FILE"])
    assert metrics["secret"]["secretName"] == "cdui-metrics"
    # The probes ask routes the server has: readiness the one that says 503 when degraded.
    cfg = config.load({"CODEFYUI_USER_DATA_DIR": "/nonexistent/ud", "CODEFYUI_DATA_DIR": "/nonexistent/data"})
    app = cdui.plane.server.build_app(cfg, cdui.core.clock.SystemClock())
    paths = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    assert container["readinessProbe"]["httpGet"]["path"] == "/api/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/api/health/live"
    assert {"/api/health", "/api/health/live"} <= paths
    # The Ingress's host is one the server answers (its Host check).
    ingress = one(docs, "Ingress", "cdui")
    hosts = {r["host"] for r in ingress["spec"]["rules"]}
    assert hosts <= set(config.load({"CODEFYUI_EXTRA_ALLOWED_HOSTS": env["CODEFYUI_EXTRA_ALLOWED_HOSTS"]}
                                    )["CODEFYUI_EXTRA_ALLOWED_HOSTS"])
    assert f"cdui:{port}" in env["CODEFYUI_EXTRA_ALLOWED_HOSTS"].split(",")


def test_the_containerfile_passes_hadolint() -> None:
    r = subprocess.run([tool("hadolint"), str(ROOT / "deploy" / "container" / "Containerfile")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.e2e
def test_the_control_plane_starts_again_as_pid_1_over_its_old_pidfile(tmp_path: Path) -> None:
    """A container restarted on the same volume (the StatefulSet's pod after a crash) runs `cdui start` as
    pid 1 again, and the volume still holds the pidfile of the one before, which was pid 1 too: the new
    server must serve, not take itself for a server already running. Reproduced in a PID namespace."""
    from procs import Proc, env_for, free_port, wait_for  # noqa: PLC0415  (e2e helpers, this test only)
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("cannot make a PID namespace here (unshare needs root or user namespaces)")
    ud = tmp_path / "ud"
    ud.mkdir(mode=0o700)
    (ud / "cdui.pid").write_text("1")
    port = free_port()
    argv = [unshare, "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM",
            sys.executable, "-m", "cdui", "start", "--foreground", "--host", "127.0.0.1", "--port", str(port)]
    server = Proc(argv, env_for(ud, tmp_path / "data"), tmp_path / "server.log", name="server-pid1")
    server.spawn()
    try:
        def live() -> bool:
            assert server.alive, f"the server exited: {server.log_tail(10)}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health/live", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_for(live, 120, 0.2, "the server to serve as pid 1", detail=server.log_tail)
        assert json.loads((ud / "server.json").read_text())["pid"] == 1
    finally:
        # unshare passes no SIGTERM on to its child: the whole group gets it, the server (pid 1 of its
        # namespace, with a handler) included, as a container runtime's stop does.
        server._signal_group(signal.SIGTERM)
        server.stop()
