"""The free executors' order kept between dispatch passes (cdui/plane/sched/free_order.py): always
what sorting its members by the queue's order gives, whatever the order of the changes."""
from __future__ import annotations

import random

import pytest

from cdui.plane.dispatch import RunQueue
from cdui.plane.sched.free_order import FreeOrder


def test_free_order_is_the_queue_order_of_its_members_after_any_changes() -> None:
    rng = random.Random(24)
    q = RunQueue()
    names = [f"w{i:03d}" for i in range(60)]
    free = FreeOrder(q.free_key)
    free.reset(rng.sample(names, 30))
    members = set(free)
    assert list(free) == q.free_order(sorted(members))
    for step in range(3000):
        n = rng.choice(names)
        op = rng.random()
        if op < 0.35:
            free.add(n)
            members.add(n)
        elif op < 0.6:
            free.discard(n)
            members.discard(n)
        elif op < 0.9:
            # A placement as the pass makes it: out of the order, given a run, back at the end if still free.
            was = n in free
            free.discard(n)
            q.used(n)
            if was and rng.random() < 0.5:
                free.add(n)
                assert list(free)[-1] == n, step
            else:
                members.discard(n)
        else:
            keep = rng.sample(names, rng.randrange(len(names)))
            free.reset(keep)
            members = set(keep)
        assert list(free) == q.free_order(sorted(members)), step
        assert len(free) == len(members) and all(m in free for m in members), step


def test_an_executor_whose_place_changed_while_in_the_order_is_an_error_not_a_silent_loss() -> None:
    q = RunQueue()
    free = FreeOrder(q.free_key)
    free.reset(["a", "b", "c"])
    q.used("a")  # the rule broken: given a run without being taken out first
    with pytest.raises(RuntimeError, match="'a' changed its place in the free order"):
        free.discard("a")
    free.discard("x")  # not in it: nothing
    assert list(free) == ["a", "b", "c"]
