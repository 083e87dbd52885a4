"""The store's row classes on a real file: workers, enrollment tokens, SSH workers.

Each multi-statement method is one transaction: it happens whole or not at all.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cdui.core.errors import CduiError
from cdui.plane.store import SshCleanupRow, Store, TokenRow


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def accept(row: TokenRow | None, taken: Any) -> tuple[str, str | None]:
    assert row is not None
    return (row["worker"] or "w1"), row["worker"]


def test_enrollment_adds_the_worker_and_a_reissue_supersedes_its_credential(store: Store) -> None:
    async def go() -> None:
        await store.tokens.add("tok1", "h1", 2, 100.0, None, 1.0)
        assert await store.tokens.enroll("tok1", accept, "cred-a", ["cpu"], "m1", 2.0) == "w1"
        row = await store.workers.get("w1")
        assert row is not None and (row["credential_hash"], row["devices"], row["machine_id"]) == \
            ("cred-a", '["cpu"]', "m1")
        assert (await store.workers.by_credential("cred-a") or {}).get("name") == "w1"
        assert [t["uses_left"] for t in await store.tokens.active()] == [1]

        await store.tokens.add("re1", "h2", 1, 100.0, "w1", 3.0)  # a reissue token, bound to w1
        assert await store.tokens.enroll("re1", accept, "cred-b", ["cuda:0"], "m1", 4.0) == "w1"
        assert await store.workers.by_credential("cred-a") is None
        assert await store.workers.old_credential("cred-a") == {"credential_hash": "cred-a", "worker": "w1",
                                                               "reason": "superseded", "at": 4.0}
        assert {t["id"]: t["uses_left"] for t in await store.tokens.active()} == {"tok1": 1, "re1": 0}
    run(go())


def test_a_refused_enrollment_takes_no_use(store: Store) -> None:
    def refuse(row: TokenRow | None, taken: Any) -> tuple[str, str | None]:
        assert row is not None and not taken("w1")
        raise CduiError("token_expired", "expired")

    async def go() -> None:
        await store.tokens.add("tok1", "h1", 1, 100.0, None, 1.0)
        with pytest.raises(CduiError):
            await store.tokens.enroll("tok1", refuse, "cred-a", [], "m1", 2.0)
        assert [t["uses_left"] for t in await store.tokens.active()] == [1]
        assert await store.workers.all() == []
        assert await store.tokens.revoke("tok1") and not await store.tokens.revoke("nope")
        assert await store.tokens.active() == []
    run(go())


def test_removing_a_worker_keeps_its_credential_as_removed_and_revokes_its_tokens(store: Store) -> None:
    async def go() -> None:
        await store.tokens.add("tok1", "h1", 1, 100.0, None, 1.0)
        await store.tokens.enroll("tok1", accept, "cred-a", ["cpu"], "m1", 2.0)
        await store.tokens.add("re1", "h2", 1, 100.0, "w1", 3.0)
        assert await store.workers.set_drained("w1", True)
        assert not await store.workers.set_drained("nobody", True)
        await store.workers.remove("w1", 5.0)
        assert await store.workers.get("w1") is None
        assert (await store.workers.old_credential("cred-a") or {}).get("reason") == "removed"
        assert [t["id"] for t in await store.tokens.active()] == ["tok1"]  # the reissue token is revoked
    run(go())


def test_enabling_a_worker_cancels_its_drain_and_one_shot_marks_round_trip(store: Store) -> None:
    async def go() -> None:
        await store.tokens.add("tok1", "h1", 1, 100.0, None, 1.0)
        await store.tokens.enroll("tok1", accept, "cred-a", ["cpu"], "m1", 2.0)
        await store.workers.set_drained("w1", True)
        assert await store.workers.set_disabled("w1", True)
        row = await store.workers.get("w1")
        assert row is not None and (row["disabled"], row["drained"]) == (1, 1)
        assert await store.workers.set_disabled("w1", False)
        row = await store.workers.get("w1")
        assert row is not None and (row["disabled"], row["drained"]) == (0, 0)

        await store.workers.set_one_shot("w1", None)
        assert await store.workers.one_shot_names() == ["w1"]
        await store.workers.set_one_shot_run("w1", "r1")
        row = await store.workers.get("w1")
        assert row is not None and (row["one_shot"], row["one_shot_run"]) == (1, "r1")
        await store.workers.clear_one_shot("w1")
        assert await store.workers.one_shot_names() == []
        assert await store.workers.names_instance("w1.a", "w1") and not await store.workers.names_instance("w1", "w1")

        await store.workers.set_share_by_memory("w1", ["cuda:0"])
        assert await store.workers.share_settings() == {"w1": '["cuda:0"]'}
        assert await store.workers.offered_devices() == {"w1": ["cpu"]}
    run(go())


def test_an_ssh_slot_stays_taken_until_its_cleanup_ends(store: Store) -> None:
    def first_free(taken: set[int]) -> int:
        return min(set(range(3)) - taken)

    async def go() -> None:
        assert await store.ssh.add("a", "u@h", 22, None, "~/c", first_free, 1.0) == 0
        assert await store.ssh.add("a", "u@h", 22, None, "~/c", first_free, 1.0) is None  # the name is taken
        assert await store.ssh.new_launch_token("a", "t1", "h1", 100.0, 1.0) is None  # not enrolled yet
        assert await store.ssh.new_launch_token("a", "t2", "h2", 100.0, 2.0) is None
        assert [t["id"] for t in await store.tokens.active()] == ["t2"]  # only one outstanding
        await store.ssh.set_tunnel("a", "up", None, 42, ["line"])
        row = await store.ssh.get("a")
        assert row is not None and (row["state"], row["remote_pid"], row["recent_output"]) == ("up", 42, '["line"]')

        await store.ssh.delete("a", SshCleanupRow(slot=0, name="a", target="u@h", port=22, identity=None,
                                                  remote_cdui="~/c", started_at=3.0))
        assert await store.ssh.all() == [] and await store.tokens.active() == []
        assert [c["slot"] for c in await store.ssh.cleanups()] == [0]
        assert await store.ssh.add("b", "u@h", 22, None, "~/c", first_free, 4.0) == 1  # 0 is still being cleaned
        await store.ssh.cleanup_done(0)
        assert await store.ssh.add("c", "u@h", 22, None, "~/c", first_free, 5.0) == 0
    run(go())


def test_an_apps_invoke_records_are_pruned_to_the_newest_kept(store: Store) -> None:
    async def go() -> None:
        await store.apps.publish("a", True, "g", {"nodes": []}, {"inputs": [], "outputs": []}, None, None, None,
                                 None, 1.0)
        await store.apps.publish("b", True, "g", {"nodes": []}, {"inputs": [], "outputs": []}, None, None, None,
                                 None, 1.0)
        await store.apps.record_invoke("b", 1, None, "succeeded", None, 1.0, None, None, 1.0, 5)
        for i in range(250):
            await store.apps.record_invoke("a", 1, None, "succeeded", None, 1.0, None, None, float(i), 20)
        # Pruned at ids 100 and 200 (each PRUNE_EVERY records): "a" keeps its newest 20 then, and those since.
        ids = [r["id"] for r in await store.apps.invokes("a", 500)]
        assert ids == list(range(251, 180, -1)), ids
        assert len(await store.apps.invokes("b", 500)) == 1  # another app's records are its own
        await store.apps.delete("a")
        assert await store.apps.invokes("a", 500) == [] and await store.apps.versions("a") == []
        assert await store.apps.record_invoke("a", 1, None, "failed", None, 1.0, None, None, 9.0, 20) is None
    run(go())
