"""TrainingLoop's ``strategy: ddp``: one training across the devices of one machine.

The run's process forks one process per rank (``fork``: the model, data and
optimizer other nodes built are copied as they are, so nothing has to be
picklable, and a plugin's classes need not be importable by name). The ranks
meet over torch.distributed on a loopback port (gloo on CPU, nccl on CUDA,
one card per rank); there is no training across machines. Each rank trains
the same loop on its shard of the data (``DistributedSampler`` without
shuffling, and the per-rank batch size is the loader's divided by the number
of ranks, so the ranks together take the same batches as one process would);
DistributedDataParallel averages the gradients.

Rank 0 reports (logs, metrics, progress, checkpoints); the others are silent.
A stop reaches the ranks through an event they all read at the same points,
agreed on with an all-reduce, so no rank waits in a collective another left.
Rank 0 sends the result (model weights, losses, metrics, files written) back
over a pipe; an exception in any rank fails the node with its traceback.
"""
from __future__ import annotations

import io
import multiprocessing as mp
import os
import socket
import time
import traceback
from typing import TYPE_CHECKING, Any

from cdui.graph.context import RunStopped

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

MAX_RANKS = 64
JOIN_POLL_S = 0.2


class Dist:
    """What one rank's training loop needs to know about the others."""

    def __init__(self, rank: int, world: int, device: str, stop: Any) -> None:
        self.rank, self.world, self.device, self._stop = rank, world, device, stop

    @property
    def main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: Any) -> Any:
        from torch.nn.parallel import DistributedDataParallel
        ids = [int(self.device.split(":")[1])] if self.device.startswith("cuda:") else None
        return DistributedDataParallel(model, device_ids=ids)

    def shard(self, loader: Any) -> Any:
        """The loader over this rank's shard, with the global batch size kept."""
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler
        batch = max(1, int(getattr(loader, "batch_size", None) or 1) // self.world)
        sampler: Any = DistributedSampler(loader.dataset, num_replicas=self.world, rank=self.rank, shuffle=False)
        return DataLoader(loader.dataset, batch_size=batch, sampler=sampler,
                          collate_fn=getattr(loader, "collate_fn", None))

    def mean(self, value: float) -> float:
        import torch
        import torch.distributed as dist
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device if self._nccl else "cpu")
        dist.all_reduce(t)
        return float(t.item()) / self.world

    @property
    def _nccl(self) -> bool:
        return self.device.startswith("cuda")

    def should_stop(self) -> bool:
        import torch
        import torch.distributed as dist
        t = torch.tensor([1 if self._stop.is_set() else 0], device=self.device if self._nccl else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())


class RankContext:
    """The run's context as one rank sees it: rank 0 reports, the others do not;
    every rank asks the agreed stop flag."""

    def __init__(self, ctx: RunContext, d: Dist) -> None:
        self._ctx, self._dist = ctx, d
        self.device = d.device

    def should_stop(self) -> bool:
        return self._dist.should_stop()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._ctx, name)
        if not self._dist.main and name in ("log", "metric", "progress", "warning", "artifact", "emit"):
            return lambda *a, **k: None
        return value


def world_devices(requested: int, run_device: str, device_set: list[str] | None = None) -> list[str]:
    """One device per rank: CUDA cards this process sees (all of them unless
    ``requested`` says how many), or ``requested`` CPU processes. When the run was
    given a set of several devices (``device_set``, as its process names them), an
    unset ``requested`` means one process per member: the scheduler reserved them."""
    given = len(device_set) if device_set and len(device_set) > 1 else 0
    if run_device.startswith("cuda"):
        import torch
        cards = torch.cuda.device_count()
        n = requested or given or cards
        if n > cards:
            raise ValueError(f"strategy ddp asks for {n} processes but the run has {cards} CUDA card(s); "
                             f"set ddp_processes to at most {cards}")
        return [f"cuda:{i}" for i in range(n)]
    n = requested or given or 1
    if not 1 <= n <= MAX_RANKS:
        raise ValueError(f"ddp_processes={n} is out of range (1..{MAX_RANKS})")
    return ["cpu"] * n


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(train: Any, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext,
        devices: list[str]) -> dict[str, Any]:
    """Train with one forked process per device; ``train(inputs, params, ctx, dist)`` is the
    loop of one rank and returns its outputs (rank 0's are the node's)."""

    import torch
    if any(d.startswith("cuda") for d in devices) and torch.cuda.is_initialized():
        raise RuntimeError("strategy ddp forks its ranks, which CUDA forbids once this process has used a card; "
                           "keep the model on the CPU before TrainingLoop (its device param moves it)")
    world = len(devices)
    fork = mp.get_context("fork")
    stop = fork.Event()
    port = _free_port()
    pipes = []
    pids = []
    for rank, device in enumerate(devices):
        reader, writer = fork.Pipe(duplex=False)
        # os.fork, not multiprocessing.Process: its start-up closes sys.stdin, whose lock the run
        # process's stdin reader thread holds, so a Process child would wait for it forever.
        pid = os.fork()
        if pid == 0:
            reader.close()
            _rank_main(train, inputs, params, ctx, rank, world, device, port, stop, writer)  # never returns
        writer.close()
        pipes.append(reader)
        pids.append(pid)
    results: dict[int, Any] = {}
    exited: dict[int, int] = {}
    try:
        while len(results) < world:
            if ctx.should_stop():
                stop.set()
            for rank, reader in enumerate(pipes):
                if rank in results:
                    continue
                if reader.poll(JOIN_POLL_S / world):
                    try:
                        results[rank] = reader.recv()
                    except EOFError:
                        results[rank] = ("error", f"rank {rank} exited without a result")
                elif rank not in exited:
                    done, status = os.waitpid(pids[rank], os.WNOHANG)
                    if done:
                        exited[rank] = status
                        if not reader.poll():
                            results[rank] = ("error", f"rank {rank} exited with status {status} without a result")
    finally:
        for rank, pid in enumerate(pids):
            if rank not in exited:
                _reap(pid)
        for reader in pipes:
            reader.close()
    errors = [f"rank {r}: {v[1]}" for r, v in sorted(results.items()) if v[0] == "error"]
    if errors:
        raise RuntimeError("strategy ddp failed: " + "; ".join(errors))
    if any(v[0] == "stopped" for v in results.values()):
        raise RunStopped()
    out: dict[str, Any] = torch.load(io.BytesIO(results[0][1]), weights_only=False)
    model = inputs["model"]
    model.load_state_dict(out.pop("model_state"))
    for path in out.pop("written"):
        ctx.written.append(path)
    out["model"] = model
    return out


def _reap(pid: int) -> None:
    """Wait for a rank that sent its result (it exits at once); kill one that hangs."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)


def _rank_main(train: Any, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext, rank: int, world: int,
               device: str, port: int, stop: Any, pipe: Any) -> None:
    import torch
    import torch.distributed as dist
    # A forked child cannot use the OpenMP thread pool its parent started (it hangs in it), as
    # torch's own DataLoader workers know: one intra-op thread per rank.
    torch.set_num_threads(1)
    try:
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                                init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        d = Dist(rank, world, device, stop)
        written_before = len(ctx.written)
        try:
            out = train(inputs, params, RankContext(ctx, d), d)
        except RunStopped:
            pipe.send(("stopped", None))
            return
        if rank == 0:
            model = out.pop("model")
            out["model_state"] = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            out["written"] = list(ctx.written[written_before:])
            # As bytes: torch would pass tensors as shared memory, gone once this process exits.
            buf = io.BytesIO()
            torch.save(out, buf)
            pipe.send(("ok", buf.getvalue()))
        else:
            pipe.send(("ok", None))
        dist.destroy_process_group()
    except BaseException:  # every failure goes to the parent, which fails the node with it
        try:
            pipe.send(("error", traceback.format_exc(limit=8)))
        except Exception:
            pass
    finally:
        pipe.close()
        os._exit(0)  # no atexit handlers of the run process in a forked copy
