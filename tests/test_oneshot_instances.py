"""Instances on the worker side, on real files: the default ID from SLURM's environment, one
agent per ID, the sweep of folders left by killed instances, and filesystems without locks."""
from __future__ import annotations

import errno
import os

import pytest

from cdui.agent import instances
from cdui.core.errors import CduiError


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "4245"}, "4242-3"),
    ({"SLURM_JOB_ID": "777"}, "777"),
    ({"SLURM_JOB_ID": "777", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2"}, "777-0-2"),
    ({"SLURM_ARRAY_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": "1", "SLURM_STEP_ID": "4", "SLURM_PROCID": "0"}, "9-1-4-0"),
    ({}, "0123456789abcdef"),
])
def test_default_id_comes_from_slurm(env, expected):
    assert instances.default_id(env, rand=lambda n: "0123456789abcdef"[: 2 * n]) == expected


def test_a_random_default_id_is_16_hex_characters():
    got = instances.default_id({})
    assert len(got) == 16 and int(got, 16) >= 0


@pytest.mark.parametrize("bad", ["", "a.b", "../x", "a/b", "-x", "x" * 65])
def test_ids_that_cannot_be_a_name_or_a_folder_are_refused(bad):
    with pytest.raises(CduiError):
        instances.check_id(bad)


def test_an_id_already_running_is_refused_before_its_folder_is_touched(tmp_path):
    first = instances.Instance(tmp_path, "7-0")
    first.claim()
    (first.folder / "spool").mkdir()
    try:
        with pytest.raises(CduiError, match="already running"):
            instances.Instance(tmp_path, "7-0").claim()
        assert (first.folder / "spool").is_dir()
    finally:
        first.release()
    assert not first.folder.exists()
    assert not (tmp_path / "agent-instances" / ".7-0.lock").exists()


def _age(path, seconds):
    t = os.stat(path).st_mtime - seconds
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            os.utime(os.path.join(root, n), (t, t))
    os.utime(path, (t, t))


def test_folders_of_killed_instances_go_after_24_h_unchanged_and_unheld(tmp_path):
    root = tmp_path / "agent-instances"
    for name in ("old", "recent", "held"):
        (root / name / "spool").mkdir(parents=True)
        (root / name / "spool" / "events.jsonl").write_text("{}\n")
    _age(root / "old", 25 * 3600)
    _age(root / "held", 25 * 3600)
    (root / "recent" / "spool" / "events.jsonl").touch()
    alive = instances.Instance(tmp_path, "held")
    alive.claim()
    (alive.folder / "x").write_text("")  # claim() made it new; age it again, still held
    _age(alive.folder, 25 * 3600)
    me = instances.Instance(tmp_path, "me")
    me.claim()
    try:
        assert me.sweep_stale() == ["old"]
        assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["held", "me", "recent"]
    finally:
        me.release()
        alive.release()


def test_a_filesystem_without_locks_warns_and_goes_on(tmp_path, capsys):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    inst = instances.Instance(tmp_path, "t1", flock=no_locks)
    inst.claim()
    try:
        assert inst.folder.is_dir()
        err = capsys.readouterr().err
        assert "does not support file locks" in err and "own --instance ID" in err
    finally:
        inst.release()
    fd = os.open(tmp_path / "lockfile", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert instances.lock(fd, "enrollment", "waiting", flock=no_locks) is False
    finally:
        os.close(fd)
