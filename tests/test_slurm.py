"""SLURM for real: a single-host cluster runs the shipped ``deploy/slurm/codefyui.sbatch`` as an
array of 4 against a real control plane.

The fixture configures Debian's munged, slurmctld and slurmd in a temporary folder on
loopback (a generated munge key, ``SlurmctldHost=localhost``, ``proctrack/linuxproc`` and
``task/none`` so no cgroups are needed, root as ``SlurmUser``) and runs them as children
of the test; the node may oversubscribe its CPUs so the four tasks run together, as an
array on a real cluster does. Skipped with the reason when the binaries are missing.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procs import (
    REPO_ROOT,
    Proc,
    ServerProc,
    csv_print_graph,
    env_for,
    free_port,
    long_training_graph,
    wait_for,
    wait_run,
)
from syspkgs import require_commands

pytestmark = [pytest.mark.e2e, require_commands("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo"),
              pytest.mark.skipif(os.geteuid() != 0, reason="the single-host SLURM cluster runs as root")]
SCRIPT = REPO_ROOT / "deploy" / "slurm" / "codefyui.sbatch"


def _node_cpus() -> int:
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"\bCPUs=(\d+)", out)
    return int(m.group(1)) if m else 1


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.procs: list[Proc] = []

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        sock, key = self.root / "sock", self.root / "munge"
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir()
        sock.mkdir(mode=0o755)  # munged wants its socket's folder open to everyone
        key.mkdir(mode=0o700)
        (key / "munge.key").write_bytes(os.urandom(1024))
        os.chmod(key / "munge.key", 0o600)
        r = self.root
        self.conf.write_text(f"""\
ClusterName=cduitest
SlurmctldHost=localhost
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}/munge.sock
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
MinJobAge=3600
# The time-limit test: SIGTERM exactly at the limit (no overtime), and SIGKILL only if the agent
# has not ended 30 s later, well past the 10 s it gives the run to write its interrupt checkpoint.
OverTimeLimit=0
KillWait=30
NodeName=localhost NodeHostname={os.uname().nodename} NodeAddr=127.0.0.1 CPUs={_node_cpus()} RealMemory=500 \
State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")

    def start(self) -> None:
        self.write_config()
        r, env = self.root, self.env
        for name, cmd in (
                ("munged", ["munged", "-F", "-S", f"{r}/sock/munge.sock", f"--key-file={r}/munge/munge.key",
                            f"--log-file={r}/log/munged.log", f"--pid-file={r}/munge/munged.pid",
                            f"--seed-file={r}/munge/seed"]),
                ("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)]),
                ("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", "localhost"])):
            p = Proc([shutil.which(cmd[0]) or cmd[0], *cmd[1:]], env, r / "log" / f"{name}.out", cwd=r, name=name)
            p.spawn()
            self.procs.append(p)
            if name == "munged":
                wait_for(lambda: (r / "sock" / "munge.sock").exists(), 60, 0.1, "munged's socket",
                         detail=p.log_tail)

        def idle() -> bool:
            for p in self.procs:
                if not p.alive:
                    raise AssertionError(f"{p.name} exited with {p.returncode}:\n{p.log_tail(30)}")
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=60)
            return out.stdout.strip() == "idle"
        wait_for(idle, 120, 0.5, "the SLURM node to be idle", detail=lambda: self.procs[-1].log_tail(20))

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True, timeout=60)
        for p in reversed(self.procs):
            p.stop(30)

    def job_tasks(self, job: str) -> list[dict[str, str]]:
        """``scontrol show job`` of every task of an array job, as key=value maps."""
        out = subprocess.run(["scontrol", "-o", "show", "job", job], env=self.env, capture_output=True, text=True,
                             timeout=60).stdout
        return [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="cdui-slurm-"))
    os.chmod(root, 0o755)
    c = Cluster(root)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def _job_env(cluster: Cluster, cp: ServerProc, home: Path, data: Path, tok: str) -> dict[str, str]:
    """What a user's job environment would carry, pointed at the test control plane; the script
    itself is the shipped one."""
    env = {**env_for(home / ".codefyui-agent", data), **cluster.env, "HOME": str(home),
           "CODEFYUI_ENROLL_TOKEN": tok, "CONTROL": cp.url, "CDUI": str(REPO_ROOT / "bin" / "cdui"),
           "CDUI_NO_INSTALL": "1"}
    env.pop("CODEFYUI_USER_DATA_DIR")  # the script sets it: $HOME/.codefyui-agent, shared by all tasks
    return env


def _logs(folder: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted(folder.glob("codefyui-*.log")))


def test_an_array_of_4_runs_4_pool_runs_one_per_instance_with_one_token_use(cluster: Cluster, tmp_path: Path):
    cp = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"}).start()
    try:
        runs = [cp.submit(csv_print_graph(label=f"run {i}"), {"target": {"pool": "one-shot"}, "device": "cpu"})["id"]
                for i in range(4)]
        tok = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
        home = tmp_path / "home"
        home.mkdir()
        env = _job_env(cluster, cp, home, tmp_path / "agent-data", tok)
        # No GPU here, and the script asks for none (SBATCH_GRES would); the command line lowers the CPUs.
        out = subprocess.run(["sbatch", "--parsable", "--array=0-3", "--cpus-per-task=1",
                              f"--output={tmp_path}/codefyui-%A_%a.log", f"--chdir={tmp_path}", str(SCRIPT)],
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        job = out.stdout.strip().split(";")[0]

        def logs() -> str:
            return _logs(tmp_path)

        def ended() -> list[dict[str, str]] | None:
            tasks = cluster.job_tasks(job)
            done = [t for t in tasks if t.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")]
            return tasks if len(tasks) == 4 and len(done) == 4 else None
        tasks = wait_for(ended, 600, 1.0, f"the 4 tasks of job {job} to end", detail=logs)
        tasks.sort(key=lambda t: t["ArrayTaskId"])
        states = [(t["ArrayTaskId"], t["JobState"], t["ExitCode"]) for t in tasks]
        assert states == [(str(i), "COMPLETED", "0:0") for i in range(4)], logs()

        done: list[dict[str, Any]] = [wait_run(cp, r) for r in runs]
        assert [r["status"] for r in done] == ["succeeded"] * 4
        assert sorted(r["worker_id"] for r in done) == [f"slurm.{job}-{i}" for i in range(4)]
        toks = cp.call("GET", "/api/workers/tokens")
        assert [(t["uses_total"], t["uses_left"]) for t in toks] == [(1, 0)]
        card = next(w for w in cp.call("GET", "/api/workers")["workers"] if w["name"] == "slurm")
        assert sorted(d["name"] for d in card["instances"]["departed"]) == [f"slurm.{job}-{i}" for i in range(4)]
        assert list((home / ".codefyui-agent" / "agent-instances").glob("*-*")) == []  # each removed its folder
    finally:
        cp.stop()


def test_a_sweep_for_the_pool_and_the_array_it_emits_run_one_variant_per_task(cluster: Cluster, tmp_path: Path):
    """#27: `cdui sweep --target one-shot --emit-sbatch` queues the sweep and prints the shipped script with
    its array sized to the variants; submitted as printed, 4 tasks take 4 variants, one each."""
    cp = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"}).start()
    try:
        graph = tmp_path / "csv-print.json"
        graph.write_text(json.dumps(csv_print_graph()))
        labels = ["a", "b", "c", "d"]
        r = subprocess.run([str(REPO_ROOT / "bin" / "cdui"), "sweep", str(graph), "--param",
                            f"print.label={','.join(labels)}", "--target", "one-shot", "--device", "cpu",
                            "--emit-sbatch"], env=cp.env, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        assert "#SBATCH --array=0-3%4" in r.stdout.splitlines(), r.stdout
        sweep_id = r.stderr.split()[1].rstrip(":")
        script = tmp_path / "sweep.sbatch"
        script.write_text(r.stdout)
        tok = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
        home = tmp_path / "home"
        home.mkdir()
        env = _job_env(cluster, cp, home, tmp_path / "agent-data", tok)
        # The array as printed; the command line lowers the CPUs and puts the logs here.
        out = subprocess.run(["sbatch", "--parsable", "--cpus-per-task=1", f"--output={tmp_path}/codefyui-%A_%a.log",
                              f"--chdir={tmp_path}", str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        job = out.stdout.strip().split(";")[0]

        def ended() -> list[dict[str, str]] | None:
            tasks = cluster.job_tasks(job)
            done = [t for t in tasks if t.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")]
            return tasks if len(tasks) == 4 and len(done) == 4 else None
        tasks = wait_for(ended, 600, 1.0, f"the 4 tasks of job {job} to end", detail=lambda: _logs(tmp_path))
        assert sorted((t["ArrayTaskId"], t["JobState"]) for t in tasks) == [(str(i), "COMPLETED") for i in range(4)]
        sweep = wait_for(lambda: (lambda s: s if s["status"] == "finished" else None)(
            cp.call("GET", f"/api/sweeps/{sweep_id}")), 120, 0.5, f"sweep {sweep_id} to finish")
        assert sweep["counts"] == {"succeeded": 4}, sweep
        assert [v["params"] for v in sweep["variants"]] == [{"print.label": x} for x in labels]
        # One variant per task: four one-shot instances, each ran exactly one of them.
        assert sorted(v["worker_id"] for v in sweep["variants"]) == [f"slurm.{job}-{i}" for i in range(4)]
        for v in sweep["variants"]:
            params = {n["id"]: n["data"]["params"] for n in cp.call("GET", f"/api/runs/{v['run_id']}/graph")["graph"]
                      ["nodes"]}
            assert params["print"]["label"] == v["params"]["print.label"]
    finally:
        cp.stop()


@pytest.mark.long
def test_the_jobs_time_limit_interrupts_the_run_with_its_checkpoint_and_the_agent_exits_1(cluster: Cluster,
                                                                                          tmp_path: Path):
    """SLURM's own time limit, not a signal the test sends: at ``--time=1`` slurmstepd sends
    SIGTERM to every process of the job (the agent and the run's subprocess alike)."""
    cp = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"}).start()
    try:
        run_id = cp.submit(long_training_graph(), {"target": {"pool": "one-shot"}, "device": "cpu"})["id"]
        tok = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
        home = tmp_path / "home"
        home.mkdir()
        env = _job_env(cluster, cp, home, tmp_path / "agent-data", tok)
        out = subprocess.run(["sbatch", "--parsable", "--array=0", "--time=1", "--cpus-per-task=1",
                              f"--output={tmp_path}/codefyui-%A_%a.log", f"--chdir={tmp_path}", str(SCRIPT)],
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        job = out.stdout.strip().split(";")[0]

        def ended() -> dict[str, str] | None:
            tasks = cluster.job_tasks(job)
            return tasks[0] if len(tasks) == 1 and tasks[0].get("JobState") not in ("PENDING", "RUNNING",
                                                                                    "CONFIGURING", "COMPLETING") \
                else None
        # The limit is a minute; slurmctld looks for jobs past it every 30 s.
        task = wait_for(ended, 300, 1.0, f"job {job} to reach its time limit", detail=lambda: _logs(tmp_path))
        # TIMEOUT: SLURM ended it at the limit; 1:0: the agent itself exited 1 (no signal killed it).
        assert (task["JobState"], task["ExitCode"]) == ("TIMEOUT", "1:0"), _logs(tmp_path)

        r = wait_run(cp, run_id)
        assert (r["status"], r["worker_id"]) == ("interrupted", f"slurm.{job}-0"), r
        assert "one-shot agent was stopped" in r["error"]
        arts = cp.call("GET", f"/api/runs/{run_id}/artifacts")
        # The single-host cluster's node is the control plane's machine: the checkpoint is in its data folder.
        ckpt = [(a["name"], a["backend"]) for a in arts if a["kind"] == "checkpoint"]
        assert ckpt == [("interrupt.pt", "mount")], arts
        assert (cp.data_dir / "runs" / run_id / "checkpoints" / "interrupt.pt").stat().st_size > 0
    finally:
        cp.stop()
