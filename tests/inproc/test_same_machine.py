"""Same-machine placement is decided by what the agent can read and write, never by the id it names.

A real control plane in process and a fake agent that names the control
plane's own machine id, answering the same-machine probe as the test says:
as an agent on this machine would (the real answer function, reading and
writing these very folders), as a cloned VM would (the nonce file is not
there), as an agent of another OS user would (it cannot write models/), or
not at all. Only the first gets the data folder as its mount and runs that
keep the control plane's paths."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import FakeAgent, Plane

from cdui.core.config import machine_id
from cdui.wire import protocol, same_machine
from cdui.wire.protocol import Probe, ProbeAnswer
from cdui.wire.same_machine import Verdict, judge


def _truthful(probe: dict[str, Any]) -> dict[str, Any]:
    """What an agent on this machine answers: the real answer function, on these very folders."""
    found = same_machine.answer(Probe(probe["nonce_file"], probe["folders"]))
    return {"nonce": found.nonce, "cannot_read": found.cannot_read, "cannot_write": found.cannot_write}


def _cloned_vm(probe: dict[str, Any]) -> dict[str, Any]:
    """A copy of this machine: same machine id, but the file written just now is not on its disk."""
    return {"nonce": None, "cannot_read": "FileNotFoundError: No such file or directory", "cannot_write": {}}


def _other_user(probe: dict[str, Any]) -> dict[str, Any]:
    """Another OS user on this host: it reads the nonce, but models/ is not its to write."""
    good = _truthful(probe)
    models = next(f for f in probe["folders"] if f.endswith("models"))
    return {**good, "cannot_write": {models: "PermissionError: Permission denied"}}


async def _connect(cp: Plane, on_probe: Any) -> tuple[FakeAgent, dict[str, Any]]:
    agent = await FakeAgent(cp).enroll()
    agent.machine_id = machine_id()
    agent.on_probe = on_probe
    await agent.connect()
    w = await cp.worker("w1")
    assert w is not None
    return agent, w


async def test_an_agent_that_reads_and_writes_here_is_on_this_machine(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as cp:
        agent, w = await _connect(cp, _truthful)
        try:
            assert (w["same_machine"], w["same_machine_note"]) == (True, None)
            assert w["labels"] == {"data": str(cp.config.layout.data_dir)}
            [probe] = agent.probes
            assert probe["folders"] == [str(cp.config.layout.folders[f]) for f in ("models", "media", "output")]
            # The nonce file lives only for the probe.
            assert not Path(probe["nonce_file"]).exists()
            await cp.submit({"target": {"worker": "w1"}})
            job = (await agent.assignment())["job"]
            assert job["layout"] is not None and job["layout"]["data_dir"] == str(cp.config.layout.data_dir)
        finally:
            await agent.close()


@pytest.mark.parametrize("on_probe, note", [
    (_cloned_vm, "it names this machine's id but cannot read this control plane's data folder: "
                 "FileNotFoundError: No such file or directory"),
    (lambda p: {"nonce": "0" * 32, "cannot_read": None, "cannot_write": {}},
     "it names this machine's id but cannot read this control plane's data folder: it read another nonce "
     "(a copy of this machine, or a claimed id)"),
    (_other_user, "it runs on this machine but cannot write {models} (PermissionError: Permission denied), so its "
                  "runs move their files through the control plane"),
])
async def test_a_claimed_machine_id_alone_is_not_the_same_machine(dirs: dict[str, Path], on_probe: Any,
                                                                  note: str) -> None:
    """A cloned VM, a worker that only claims the id, and another OS user on this host are other machines:
    no data mount, and their runs carry none of the control plane's paths."""
    async with Plane(dirs["user_data"], dirs["data_dir"]) as cp:
        agent, w = await _connect(cp, on_probe)
        try:
            assert w["same_machine"] is False
            assert w["same_machine_note"] == note.format(models=cp.config.layout.folders["models"])
            assert w["labels"] == {}
            await cp.submit({"target": {"worker": "w1"}})
            job = (await agent.assignment())["job"]
            assert (job["layout"], job["custom_nodes_dir"], job["plugins_dir"]) == (None, None, None)
        finally:
            await agent.close()


async def test_an_agent_that_does_not_answer_the_probe_is_another_machine(
        dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(same_machine, "PROBE_TIMEOUT_S", 0.2)
    async with Plane(dirs["user_data"], dirs["data_dir"]) as cp:
        agent, w = await _connect(cp, None)
        try:
            assert (w["same_machine"], w["labels"]) == (False, {})
            assert w["same_machine_note"] == "it names this machine's id but it did not answer the probe within 0 s"
        finally:
            await agent.close()


async def test_no_probe_for_another_machine_id(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as cp:
        agent = await FakeAgent(cp).enroll()
        try:
            await agent.connect()
            w = await cp.worker("w1")
            assert w is not None and (w["same_machine"], w["same_machine_note"], agent.probes) == (False, None, [])
        finally:
            await agent.close()


# -- the agent's side and the verdict, as tables ------------------------------------------------
def test_the_agents_answer(tmp_path: Path) -> None:
    nonce_file, nonce = same_machine.write_nonce(tmp_path)
    assert nonce_file.stat().st_mode & 0o777 == 0o644  # another OS user on this host must be able to read it
    (tmp_path / "a-file").write_text("")
    ok, blocked = tmp_path / "models", tmp_path / "a-file" / "output"
    ok.mkdir()
    found = same_machine.answer(Probe(str(nonce_file), [str(ok), str(blocked)]))
    assert found.nonce == nonce and found.cannot_read is None
    assert list(found.cannot_write) == [str(blocked)] and found.cannot_write[str(blocked)].startswith(
        "NotADirectoryError")
    assert list(ok.iterdir()) == []  # the write test leaves nothing behind
    # Only a probe file is read, whatever the control plane names.
    other = same_machine.answer(Probe("/etc/hostname", [str(ok)]))
    assert (other.nonce, other.cannot_read, other.cannot_write) == (None, "'/etc/hostname' is not a probe file", {})
    same_machine.remove(nonce_file)
    gone = same_machine.answer(Probe(str(nonce_file), [str(ok)]))
    assert gone.nonce is None and gone.cannot_read is not None and gone.cannot_read.startswith("FileNotFoundError")


@pytest.mark.parametrize("found, expected", [
    (ProbeAnswer("n" * 32, None, {}), Verdict(True)),
    (ProbeAnswer("m" * 32, None, {}), Verdict(False, "it names this machine's id but cannot read this control "
                                                     "plane's data folder: it read another nonce (a copy of this "
                                                     "machine, or a claimed id)")),
    (ProbeAnswer("n" * 32, None, {"/d/output": "E2", "/d/models": "E1"}),
     Verdict(False, "it runs on this machine but cannot write /d/output (E2), so its runs move their files "
                    "through the control plane")),
    (None, Verdict(False, "it names this machine's id but it did not answer the probe")),
])
def test_the_verdict(found: ProbeAnswer | None, expected: Verdict) -> None:
    assert judge("n" * 32, found) == expected


def test_probe_messages_round_trip_and_are_bounded() -> None:
    p = Probe("/d/.cdui-probe-1", ["/d/models"])
    assert protocol.parse_server_message(p.to_json()) == p
    a = ProbeAnswer(None, "gone", {"/d/models": "PermissionError"})
    assert protocol.parse_agent_message(a.to_json()) == a
    with pytest.raises(protocol.ProtocolError, match="cannot_write has 65 items"):
        protocol.parse_agent_message(ProbeAnswer("n", None, {f"/{i}": "x" for i in range(65)}).to_json())
