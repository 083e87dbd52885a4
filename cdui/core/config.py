"""Configuration: one table of every ``CODEFYUI_*`` setting, checked once at start.

Each setting has a name, a default (the spec's), a type and a line of help.
:func:`load` reads them all from the environment and refuses a bad value with
a message naming the variable, the value and what is expected. The test suite
checks that every setting here is documented in docs/configuration.md.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cdui import __version__
from cdui.core.errors import CduiError
from cdui.core.layout import Layout, install_root_from_env, parse_read_roots

GiB = 1024 ** 3
MB = 1000 ** 2


def _int(v: str) -> int:
    return int(v.strip())


def _float(v: str) -> float:
    return float(v.strip())


def _positive_int(v: str) -> int:
    n = int(v.strip())
    if n < 1:
        raise ValueError(v)
    return n


def _bool(v: str) -> bool:
    s = v.strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(v)


def _follow(v: str) -> str:
    """CODEFYUI_AGENT_AUTO_UPDATE: ``panel`` (as the owner chose for the worker in the Workers panel),
    ``1`` (always) or ``0`` (never, whatever the panel says)."""
    s = v.strip().lower()
    if s in ("", "panel"):
        return "panel"
    return "1" if _bool(s) else "0"


def _size(v: str) -> int:
    s = v.strip().upper().replace(" ", "")
    for suffix, mult in (("GIB", GiB), ("MIB", 1024 ** 2), ("KIB", 1024), ("GB", 10 ** 9), ("MB", MB),
                         ("KB", 1000), ("G", GiB), ("M", 1024 ** 2), ("K", 1024), ("B", 1)):
        if s.endswith(suffix):
            return int(float(s[: -len(suffix)]) * mult)
    return int(s)


def _str(v: str) -> str:
    return v


def _ssh_strict(v: str) -> str:
    if v.strip() not in ("accept-new", "yes"):
        raise ValueError(v)
    return v.strip()


def _port(v: str) -> int:
    n = int(v.strip())
    if not 1 <= n <= 65535:
        raise ValueError(v)
    return n


def _devices(v: str) -> list[str]:
    devs = _list(v)
    for d in devs:
        if d != "cpu" and not (d.startswith("cuda:") and d[5:].isdigit()):
            raise ValueError(d)
    if devs and devs[-1] != "cpu":  # as the probe answers: the CPU runs graphs on every machine
        raise ValueError(v)
    return devs


def _networks(v: str) -> list[Any]:
    return [ipaddress.ip_network(x.strip(), strict=False) for x in v.split(",") if x.strip()]


MAX_CONTROL_URL = 300  # characters of a control-plane address (cdui.core.trust checks the same bound)


def public_url(value: str) -> str:
    """``CODEFYUI_PUBLIC_URL`` (and ``--public-url``): ``http(s)://host[:port]``, nothing after it."""
    u = urlsplit(value.strip())
    if u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/") or u.query or u.fragment \
            or u.username or len(value) > MAX_CONTROL_URL:
        raise ValueError(value)
    return f"{u.scheme}://{u.netloc}"


def _list(v: str) -> list[str]:
    return [x.strip() for x in v.split(",") if x.strip()]


def _read_roots(v: str) -> tuple[Path, ...]:
    return parse_read_roots(v)


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    parse: Callable[[str], Any]
    help: str
    expected: str = ""
    # A file or folder: a relative value means the folder the user ran cdui in (see absolute_paths).
    path: bool = False
    # False: the spec names it but nothing in this version reads it; setting it logs a warning at start.
    available: bool = True
    # A secret: `cdui config` masks it, and it may be given as NAME_FILE=/path (cdui.core.config_file).
    secret: bool = False


SETTINGS: list[Setting] = [
    # -- paths
    Setting("CODEFYUI_INSTALL_ROOT", None, _str, "the installation root: relative node paths resolve against it, data/ sits in it (default: the checkout cdui runs from, else ~/CodefyUI)", "a folder", path=True),
    Setting("CODEFYUI_USER_DATA_DIR", None, _str, "all state of this process: database, tokens, pidfiles, logs, agent files", "a folder", path=True),
    Setting("CODEFYUI_DATA_DIR", None, _str, "the data folders (files/ images/ models/ media/ output/ ...) at once", "a folder", path=True),
    Setting("CODEFYUI_PROJECT_DIR", None, _str, "a project folder (codefyui.project.toml) that is the data folder; set by --project", "a folder", path=True),
    Setting("CODEFYUI_DATA_FILES_DIR", None, _str, "uploaded data files", "a folder", path=True),
    Setting("CODEFYUI_IMAGES_DIR", None, _str, "uploaded images", "a folder", path=True),
    Setting("CODEFYUI_MODELS_DIR", None, _str, "models (uploads and ModelSaver/CheckpointSaver outputs)", "a folder", path=True),
    Setting("CODEFYUI_MEDIA_DIR", None, _str, "media files", "a folder", path=True),
    Setting("CODEFYUI_READ_ROOTS", (), _read_roots, "folders absolute node paths may read on this machine, e.g. /datasets,/scratch (none by default)", "comma-separated absolute folders"),
    Setting("CODEFYUI_MACHINE_ID", None, _str, "overrides this machine's id (an agent on the server's host counts as another machine)", "a string"),
    # -- server
    Setting("CODEFYUI_PORT", None, _port, "the port `cdui start` listens on when --port is not given (default: the port the last `cdui start --port` used, else 8000)", "a port number from 1 to 65535"),
    Setting("CODEFYUI_EXTRA_ALLOWED_HOSTS", [], _list, "extra host:port values accepted as HTTP Host", "comma-separated host:port"),
    Setting("CODEFYUI_TRUSTED_PROXIES", [], _networks, "reverse proxies whose X-Forwarded-For and X-Forwarded-Proto are believed (none: the socket's peer is the client)", "comma-separated IP addresses or networks, e.g. 127.0.0.1,10.1.0.0/24"),
    Setting("CODEFYUI_SESSION_TOKEN_FILE", None, _str, "a file (mode 0600) holding the session token, kept across restarts; created with a new token when missing (default: a new token at every start)", "a file", path=True),
    Setting("CODEFYUI_METRICS_TOKEN_FILE", None, _str, "a file holding the read-only token GET /metrics accepts as `Authorization: Bearer` (Prometheus's bearer_token_file); the session token is accepted too", "a file", path=True),
    Setting("CODEFYUI_METRICS_LOOPBACK", True, _bool, "1 lets a client on this machine's loopback (not through a proxy or an SSH tunnel) read GET /metrics without a token; 0 asks every scraper for a token", "0 or 1"),
    Setting("CODEFYUI_BOOTSTRAP", True, _bool, "0 refuses /api/auth/bootstrap to everyone (the page then asks for the session token)", "0 or 1"),
    Setting("CODEFYUI_MAX_UPLOAD_SIZE", 500 * MB, _size, "largest single uploaded file, in bytes (500 MB)", "bytes, or a size like 500MB"),
    Setting("CODEFYUI_RUN_QUEUE_MAX_CONCURRENT", "", _str, "concurrency caps: N, device=N, name/device=N (comma-separated)", "e.g. 2,cpu=1,w1/cuda:0=2"),
    Setting("CODEFYUI_RUN_RETENTION_KEEP_LAST", 0, _int, "keep only the newest N finished runs (0 keeps all)", "an integer"),
    Setting("CODEFYUI_SHUTDOWN_GRACE_S", 10.0, _float, "seconds a graceful server stop gives runs to stop", "seconds"),
    Setting("CODEFYUI_RUN_WARM_SPARE", True, _bool, "1 keeps a zygote with torch imported that forks each run's process, so runs start warm; 0 starts every run cold", "0 or 1"),
    Setting("CODEFYUI_LOCAL_DEVICES", [], _devices, "the devices the control plane's own runs use, instead of probing them at start (a helper process that imports torch); empty probes", "comma-separated, ending with cpu: cpu, or cuda:0,cuda:1,cpu"),
    Setting("CODEFYUI_STOP_GRACE_S", 10.0, _float, "seconds a stopped run has to end before it is killed", "seconds"),
    # -- the canvas's per-tab processes (docs/canvas.md)
    Setting("CODEFYUI_CANVAS_MAX_PROCESSES", 4, _positive_int, "most canvas processes (one per editor tab) alive at once; the least recently used ends first", "an integer of at least 1"),
    Setting("CODEFYUI_CANVAS_IDLE_TIMEOUT_S", 1800.0, _float, "seconds a canvas process may sit idle before it ends (its cache and kept weights with it)", "seconds"),
    Setting("CODEFYUI_CANVAS_MAX_RSS_MB", 8192, _int, "a canvas process whose resident memory is above this after a run ends (0: no bound)", "MB"),
    Setting("CODEFYUI_CANVAS_CACHE_MAX_MB", 1024, _int, "tensor bytes a canvas process's execution cache keeps (least recently used dropped first; 0 caches nothing)", "MB"),
    # -- published apps' warm processes (docs/apps.md)
    Setting("CODEFYUI_APP_IDLE_TIMEOUT_S", 1800.0, _float, "seconds an app version's warm process may sit idle before it ends (the next invoke starts a new one)", "seconds"),
    Setting("CODEFYUI_APP_MAX_RSS_MB", 8192, _int, "an app's warm process whose resident memory is above this after an invoke is ended (0: no bound)", "MB"),
    Setting("CODEFYUI_APP_MAX_WAITING", 64, _positive_int, "invokes of one app that may wait for its warm process at once; more are refused with 429", "an integer of at least 1"),
    Setting("CODEFYUI_APP_PROCESSES", 1, _positive_int, "serving processes one app version may have on a device (each runs one invoke at a time; one more starts when all are busy)", "an integer of at least 1"),
    Setting("CODEFYUI_APP_INVOKES_KEPT", 100000, _positive_int, "invoke records kept per app (the oldest beyond are deleted)", "an integer of at least 1"),
    Setting("CODEFYUI_APP_RECORD_MAX_BYTES", 65536, _size, "largest JSON of an invoke's inputs or outputs kept in its record (bigger ones are kept as their size only)", "bytes, or a size like 64KiB"),
    Setting("CODEFYUI_GRAPH_MAX_NODES", 20000, _int, "most nodes a graph may have once its presets are expanded", "an integer"),
    Setting("CODEFYUI_MAX_GRAPH_BYTES", 8 * 1024 ** 2, _size, "largest JSON body of POST /api/runs and /api/graphs/validate (8 MiB)", "bytes, or a size like 8MiB"),
    # -- workers (control plane)
    Setting("CODEFYUI_WORKER_RESUME_GRACE_S", 300.0, _float, "seconds a disconnected worker's runs wait for it (0 ends them at once)", "seconds"),
    Setting("CODEFYUI_WORKER_HEARTBEAT_S", 10.0, _float, "heartbeat interval; three missed = disconnected", "seconds"),
    Setting("CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S", 60.0, _float, "wait for a worker's recorded outputs before 504", "seconds"),
    Setting("CODEFYUI_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S", 86400.0, _float, "seconds a run waits for a one-shot worker (0 forever)", "seconds"),
    Setting("CODEFYUI_PUBLIC_URL", None, public_url, "the address workers use to reach this control plane (the TLS proxy's https:// URL); generated agent commands name it", "a URL like https://codefyui.example.com"),
    Setting("CODEFYUI_TLS_CERT_FILE", None, _str, "the TLS proxy's certificate, for the fingerprint in generated commands", "a PEM file", path=True),
    Setting("CODEFYUI_MOUNT_LABEL", "data", _str, "label of the control plane's data folder", "a label"),
    Setting("CODEFYUI_TRANSFER_ENABLED", True, _bool, "1 moves files of runs on unmounted workers through the control plane", "0 or 1"),
    Setting("CODEFYUI_TRANSFER_MAX_INPUT_BYTES", 2 * GiB, _size, "largest total input of one transfer run, in bytes (2 GiB)", "bytes"),
    Setting("CODEFYUI_ENROLL_RATE_PER_MIN", 20, _int, "failed enrollment attempts allowed per token and source address per minute (ten times that per address)", "an integer"),
    # -- S3 / MinIO bucket backend (cdui/wire/s3.py)
    Setting("CODEFYUI_S3_ENABLED", False, _bool, "move files of unmounted workers through an S3/MinIO bucket", "0 or 1"),
    Setting("CODEFYUI_S3_ENDPOINT_URL", None, _str, "the bucket's API address (empty for AWS)", "a URL"),
    Setting("CODEFYUI_S3_REGION", "us-east-1", _str, "the bucket's region", "a region"),
    Setting("CODEFYUI_S3_BUCKET", None, _str, "the bucket; the backend is off without it", "a bucket name"),
    Setting("CODEFYUI_S3_PREFIX", "", _str, "prepended to every key", "a key prefix"),
    Setting("CODEFYUI_S3_ADDRESSING_STYLE", "auto", _str, "auto, path or virtual", "auto|path|virtual"),
    Setting("CODEFYUI_S3_ACCESS_KEY_ID", None, _str, "the control plane's key (memory only)", "a key id", secret=True),
    Setting("CODEFYUI_S3_SECRET_ACCESS_KEY", None, _str, "the control plane's secret (memory only)", "a secret", secret=True),
    Setting("CODEFYUI_S3_CREDENTIALS", "auto", _str, "what a worker receives: sts, static or auto", "sts|static|auto"),
    Setting("CODEFYUI_S3_STS_ROLE_ARN", None, _str, "role to assume on AWS", "an ARN"),
    Setting("CODEFYUI_S3_STS_DURATION_S", 3600, _int, "lifetime of temporary credentials (900-43200)", "seconds"),
    Setting("CODEFYUI_S3_DOWNLOAD", "proxy", _str, "proxy or presign", "proxy|presign"),
    Setting("CODEFYUI_S3_PRESIGN_TTL_S", 900, _int, "validity of presigned URLs", "seconds"),
    # -- SSH workers
    Setting("CODEFYUI_SSH_REMOTE_PORT_RANGE", "18000-18100", _str, "range of SSH slot numbers", "LOW-HIGH"),
    Setting("CODEFYUI_SSH_STRICT_HOST_KEY_CHECKING", "accept-new", _ssh_strict, "accept-new or yes", "accept-new|yes"),
    # -- agent
    Setting("CODEFYUI_RUN_OUTPUT_STORE_MAX_MB", 2048, _int, "recorded outputs a worker keeps", "MB"),
    Setting("CODEFYUI_WORKER_OUTPUTS_WRITE_TIMEOUT_S", 300.0, _float, "time for a run to write recorded outputs after it ends", "seconds"),
    Setting("CODEFYUI_AGENT_TOKEN", None, _str, "enrollment token when --token is not given", "a token", secret=True),
    Setting("CODEFYUI_AGENT_AUTO_UPDATE", "panel", _follow, "1: refused for its version, the agent installs the control plane's update bundle (every sha256 checked) into a new environment and restarts itself on it, once its runs ended; panel: only when the owner turned on \"follow updates\" for its worker in the Workers panel; 0: never", "panel, 1 or 0"),
    Setting("CODEFYUI_AGENT_ACCEPT_PLUGINS", False, _bool, "1 lets the control plane push plugin packs to this agent (`cdui plugin push`), which installs them: new code runs here", "0 or 1"),
    Setting("CODEFYUI_NODES_HIDE", [], _list, "node types this installation leaves out of its node catalog and runs, as if not installed (to try a degraded worker)", "comma-separated node types"),
    Setting("CODEFYUI_AGENT_RUN_RETENTION_KEEP_LAST", 20, _int, "finished run folders an agent keeps in agent-runs/ (0 keeps all)", "an integer"),
    # -- install
    Setting("CODEFYUI_WHEELHOUSE", None, _str, "install from this folder of wheels, offline", "a folder", path=True),
    Setting("CODEFYUI_PLUGIN_SOURCES", [], _list, "folders `cdui plugin install NAME` and `cdui project restore` look in for a pack by name (NAME/, plugins/NAME/, NAME.tar.gz, NAME-VERSION.tar.gz, NAME.zip), before the wheelhouse", "comma-separated folders"),
    Setting("CODEFYUI_TORCH_SPEC", None, _str, "pip requirement for torch used by the installer", "e.g. torch==2.13.0"),
    Setting("CODEFYUI_RELEASE_TAG", None, _str, "version to install (install.sh)", "a version"),
    # -- network nodes (Webhook, LLMChat), read by the run process of the machine that runs them
    Setting("CODEFYUI_NODE_NET_ALLOW_LOCAL", ["11434"], _list, "ports on this machine's loopback and link-local addresses (127/8, ::1, 169.254/16, fe80::/10, 0.0.0.0) that Webhook and LLMChat may call; '*' allows every port, empty refuses all (default: Ollama's 11434)", "comma-separated ports, or *"),
    Setting("CODEFYUI_LLM_KEY_HOSTS", [], _list, "hosts besides api.openai.com and api.anthropic.com (https) to which LLMChat may send this machine's OPENAI_API_KEY/ANTHROPIC_API_KEY", "comma-separated host names"),
    # -- run limits
    Setting("CODEFYUI_RUN_EVENT_MAX_BYTES", 4 * 1024 ** 2, _size, "largest run event kept whole (its data as JSON); a larger one is cut with a marker, a graph output becomes the error output_too_large (4 MiB; 0: no bound)", "bytes, or a size like 4MiB"),
    Setting("CODEFYUI_RUN_UPLOAD_QUOTA", 20 * GiB, _size, "most bytes a worker may upload to the control plane for one run, all files together (20 GiB; 0: no quota)", "bytes, or a size like 20GiB"),
    # -- settings file and log files (wip/backup; docs/operations.md)
    Setting("CODEFYUI_CONFIG", None, _str, "a settings file of NAME=VALUE lines (systemd's EnvironmentFile= format) read at every command; the environment overrides it (default: /etc/cdui/cdui.env when it exists)", "a file", path=True),
    Setting("CODEFYUI_LOG_MAX_BYTES", 10 * 1024 ** 2, _size, "size at which the log file of a background server or agent (--log-file) is rotated (10 MiB; 0: never, for Debian's logrotate)", "bytes, or a size like 10MiB"),
    Setting("CODEFYUI_LOG_BACKUP_COUNT", 5, _positive_int, "rotated log files kept beside the log (cdui.log.1 ... cdui.log.N)", "an integer of at least 1"),
]
SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}


class Config:
    """The parsed settings, plus the derived paths."""

    def __init__(self, values: dict[str, Any], layout: Layout, user_data: Path) -> None:
        self.values = values
        self.layout = layout
        self.user_data = user_data

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def get(self, name: str, default: Any = None) -> Any:
        v = self.values.get(name)
        return default if v is None else v

    @property
    def db_path(self) -> Path:
        return self.user_data / "cdui.sqlite3"

    @property
    def plugins_dir(self) -> Path:
        return self.layout.install_root / "plugins"

    @property
    def plugin_store(self) -> Path:
        """Where ``cdui plugin install`` puts packs and its lockfile ``installed.json``."""
        return self.user_data / "plugins"

    @property
    def custom_nodes_dir(self) -> Path:
        return self.layout.folder("custom_nodes")


def unavailable_settings(env: Mapping[str, str] | None = None) -> list[str]:
    """Names of the settings set in ``env`` that this version does not implement."""
    env = os.environ if env is None else env
    return [s.name for s in SETTINGS if not s.available and env.get(s.name, "").strip()]


def warn_unavailable(log: logging.Logger, env: Mapping[str, str] | None = None) -> list[str]:
    """Log one warning per unavailable setting that is set; a user who set one must learn it does nothing."""
    names = unavailable_settings(env)
    for name in names:
        log.warning("`%s` is set but not available in this version of cdui (%s); it has no effect "
                    "(unset it; see docs/configuration.md)", name, __version__)
    return names


def absolute_paths(env: Mapping[str, str], cwd: Path) -> dict[str, str]:
    """A copy of ``env`` with every relative path setting made absolute against ``cwd``.

    Background processes are started from the installation root, not from the
    user's folder; without this, ``CODEFYUI_USER_DATA_DIR=ud cdui start`` would
    put the daemon's state under the installation while the CLI waits for it
    in ``./ud``. Apply it to the environment of every re-spawned cdui process.
    """
    out = dict(env)
    for s in SETTINGS:
        raw = out.get(s.name)
        if s.path and raw:
            p = Path(raw).expanduser()
            if not p.is_absolute():
                out[s.name] = str(cwd / p)
    return out


def user_data_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    v = env.get("CODEFYUI_USER_DATA_DIR")
    return Path(v).expanduser().absolute() if v else install_root_from_env(env) / ".codefyui_dev"


def load(env: Mapping[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for s in SETTINGS:
        raw = env.get(s.name)
        if raw is None or (raw == "" and s.default is not None and s.parse is not _str):
            values[s.name] = s.default
            continue
        try:
            values[s.name] = s.parse(raw)
        except (ValueError, TypeError):
            raise CduiError("bad_setting", f"{s.name}={raw!r} is not valid: expected {s.expected or s.parse.__name__}",
                            hint=f"fix or unset {s.name} ({s.help})") from None
    return Config(values, Layout.from_env(env), user_data_dir(env))


def machine_id(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if env.get("CODEFYUI_MACHINE_ID"):
        return env["CODEFYUI_MACHINE_ID"]
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            v = Path(p).read_text().strip()
            if v:
                return v
        except OSError:
            continue
    return socket.gethostname()
