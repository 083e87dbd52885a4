"""TrainingLoop: train a model, report every epoch, checkpoint, and stop cleanly.

Ports and params are CodefyUI's (epochs, device, early stopping on
``val_loss``/``val_accuracy``, gradient clipping, mixed precision, gradient
accumulation, a step budget, periodic checkpoints, TensorBoard), plus cdui's
``checkpoint_every_steps``. The rules a run can rely on:

- **Epochs are absolute.** The loop runs ``range(start_epoch, epochs)``; epoch
  numbers in logs, progress and metrics are absolute, while the ``losses``
  output covers only the epochs this call ran.
- **Reporting.** After every epoch: ``ctx.progress(epoch, epochs, loss, ...)``
  and the metrics ``train_loss``, ``lr`` (plus ``val_loss``,
  ``val_accuracy``, ``patience_counter``, ``best_epoch`` when they apply),
  stepped by the absolute epoch number.
- **Stopping.** ``ctx.should_stop()`` is polled before every batch (training
  and validation) and between epochs. On a stop the node writes
  ``<run>/checkpoints/interrupt.pt`` (model, optimizer, number of COMPLETE
  epochs -- resume by wiring CheckpointLoader.epoch into ``start_epoch``),
  records it as a ``checkpoint`` artifact and raises ``RunStopped``.
- **Files.** Periodic checkpoints go to ``<run>/checkpoints/epoch-N.pt`` and
  ``step-N.pt``; TensorBoard scalars to ``<run>/tensorboard/``. Every file is
  recorded with ``ctx.artifact``.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdui.core.atomic import replacing
from cdui.graph.context import RunStopped
from cdui.nodes.base import ANY, DATALOADER, LOSS_FN, MODEL, OPTIMIZER, SCALAR, TENSOR, Node, Param, Port
from cdui.nodes.builtin import _ddp
from cdui.nodes.builtin._util import DEVICE_OPTIONS, as_bool, resolve_device, to_device

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext
    from cdui.nodes.builtin._ddp import Dist

PRECISIONS = ["fp32", "bf16", "fp16"]
STRATEGIES = ("single", "ddp")
BATCH_PROGRESS_INTERVAL_S = 1.0


# -- checkpoints ----------------------------------------------------------------
def checkpoint_payload(model: Any, optimizer: Any, epoch: int, losses: list[float],
                       scheduler: Any = None, scaler_state: Any = None) -> dict[str, Any]:
    """The checkpoint format CheckpointSaver writes and CheckpointLoader reads."""
    import torch

    payload: dict[str, Any] = {
        "epoch": int(epoch),
        "model_state_dict": model.state_dict(),
        "optimizer_state_dict": optimizer.state_dict(),
        "initial_lrs": [g.get("initial_lr", g["lr"]) for g in optimizer.param_groups],
        "losses": torch.tensor(losses, dtype=torch.float32),
    }
    if scheduler is not None and hasattr(scheduler, "state_dict"):
        payload["scheduler_state_dict"] = scheduler.state_dict()
        payload["scheduler_class"] = type(scheduler).__name__
    if scaler_state:
        payload["scaler_state_dict"] = dict(scaler_state)
    return payload


def write_checkpoint(payload: dict[str, Any], path: Path) -> Path:
    """Write atomically: a crash mid-save leaves the previous file intact."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        torch.save(payload, str(tmp))
    return path


# -- mixed precision --------------------------------------------------------------
class AmpPolicy:
    """fp32: nothing. bf16: autocast. fp16: autocast + GradScaler. A device
    that cannot honour the request trains in fp32 and the run says so."""

    def __init__(self, requested: Any, device: str, ctx: RunContext) -> None:
        import torch

        self.requested = str(requested or "fp32").lower()
        if self.requested not in PRECISIONS:
            ctx.warning("precision", f"unknown precision {requested!r}; training in fp32")
            self.requested = "fp32"
        self.device_type = device.split(":", 1)[0]
        allowed = {"cpu": PRECISIONS,
                   "cuda": PRECISIONS if torch.cuda.is_available() and torch.cuda.is_bf16_supported()
                   else ["fp32", "fp16"]}.get(self.device_type, ["fp32"])
        self.precision = self.requested if self.requested in allowed else "fp32"
        if self.precision != self.requested:
            ctx.warning("precision", f"{device} does not support {self.requested}; training in fp32")
        self.scaler = torch.amp.GradScaler(self.device_type) if self.precision == "fp16" else None
        self.skipped_steps = 0

    def autocast(self) -> Any:
        import torch

        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.device_type, dtype=dtype)

    def backward(self, loss: Any) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: Any) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: Any) -> bool:
        """Step; False when fp16 skipped it on an overflowing gradient."""
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        applied = self.scaler.get_scale() >= before
        self.skipped_steps += 0 if applied else 1
        return applied

    def state_dict(self) -> dict[str, Any] | None:
        return dict(self.scaler.state_dict()) if self.scaler is not None else None

    def load_state_dict(self, state: Any) -> None:
        if self.scaler is not None and isinstance(state, dict) and state:
            self.scaler.load_state_dict(state)


# -- scalar log (TensorBoard) -------------------------------------------------------
class ScalarLog:
    """TensorBoard's SummaryWriter when the ``tensorboard`` package is there;
    otherwise ``scalars.csv`` (step, tag, value, wall_time) in the same folder,
    which any plotting tool reads."""

    def __init__(self, folder: Path, now: Any) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self._now = folder, now
        self._writer: Any = None
        self._csv: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            self._writer = SummaryWriter(log_dir=str(folder))
        except Exception:  # ImportError, or a broken tensorboard install
            self._csv = open(folder / "scalars.csv", "w", encoding="utf-8")
            self._csv.write("step,tag,value,wall_time\n")

    def add(self, tag: str, value: float, step: int) -> None:
        if self._writer is not None:
            self._writer.add_scalar(tag, value, step)
        elif self._csv is not None:
            self._csv.write(f"{step},{tag},{float(value)!r},{self._now():.3f}\n")
            self._csv.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._csv is not None:
            self._csv.close()
        self._writer = self._csv = None


# -- optimizer binding --------------------------------------------------------------
def bind_optimizer(optimizer: Any, model: Any, ctx: RunContext) -> Any:
    """Make ``optimizer`` drive ``model``'s current parameters, keeping its state
    whenever the parameters still line up (a resume must not lose Adam's moments)."""
    params = list(model.parameters())
    tracked = [p for g in optimizer.param_groups for p in g["params"]]
    if len(tracked) == len(params) and all(a is b for a, b in zip(tracked, params, strict=True)):
        # Same tensors; a device move may still have stranded the state.
        optimizer.load_state_dict(optimizer.state_dict())
        return optimizer
    if len(tracked) == len(params) and all(a.shape == b.shape for a, b in zip(tracked, params, strict=True)):
        saved = optimizer.state_dict()
        offset = 0
        for group in optimizer.param_groups:
            n = len(group["params"])
            group["params"] = params[offset:offset + n]
            offset += n
        optimizer.load_state_dict(saved)
        return optimizer
    accepted = set(inspect.signature(type(optimizer).__init__).parameters)
    kwargs = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    ctx.warning("optimizer_rebuilt",
                f"the optimizer tracks {len(tracked)} tensors that do not line up with the model's "
                f"{len(params)}; training with a fresh {type(optimizer).__name__} over all parameters")
    return type(optimizer)(model.parameters(), **kwargs)


def _start_epoch(value: Any, ctx: RunContext) -> int:
    if value is None:
        return 0
    try:
        epoch = int(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        ctx.warning("start_epoch", f"start_epoch {value!r} is not a number; starting from 0")
        return 0
    return max(0, epoch)


def _split_batch(batch: Any, device: str) -> tuple[Any, Any]:
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return to_device(batch[0], device), to_device(batch[1], device)
    return to_device(batch, device), None


def _validate(model: Any, val_loader: Any, loss_fn: Any, policy: AmpPolicy, device: str,
              classification: bool, ctx: RunContext, on_stop: Any) -> tuple[float, float | None]:
    """One pass over the validation data: (mean loss, accuracy or None). ``on_stop`` raises."""
    import torch

    model.eval()
    v_total, v_count, correct, seen = 0.0, 0, 0, 0
    with torch.no_grad():
        for batch in val_loader:
            if ctx.should_stop():
                on_stop()
            data, targets = _split_batch(batch, device)
            with policy.autocast():
                outputs = model(data)
                vloss = loss_fn(outputs, targets) if targets is not None else loss_fn(outputs)
            v_total, v_count = v_total + float(vloss.item()), v_count + 1
            if classification and targets is not None:
                correct += int((outputs.argmax(dim=1) == targets).sum().item())
                seen += int(targets.numel())
    return v_total / max(v_count, 1), (correct / seen if classification and seen else None)


AUTO_LOG_LINES = 20  # log_every_epochs=0: about this many "Epoch N/M" lines in a run, whatever its epochs


def epoch_log_every(setting: int, epochs: int) -> int:
    """Every how many epochs the "Epoch N/M" line is logged: ``setting``, or for 0 (auto) every epoch up to
    20 epochs and then about 20 lines in all (400 epochs: every 20th)."""
    if setting > 0:
        return setting
    return max(1, -(-epochs // AUTO_LOG_LINES))


def _report_epoch(ctx: RunContext, log: ScalarLog | None, step_no: int, epochs: int, avg: float, lr: float,
                  val_loss: float | None, val_acc: float | None, early: dict[str, Any], line: bool = True) -> None:
    """An epoch's metrics (and TensorBoard scalars), progress event and, when ``line``, log line (the metrics
    and progress of every epoch are recorded whatever the log interval)."""
    series: dict[str, Any] = {"train_loss": avg, "lr": lr}
    if val_loss is not None:
        series["val_loss"] = val_loss
    if val_acc is not None:
        series["val_accuracy"] = val_acc
    series.update(early)
    for tag, value in series.items():
        ctx.metric(tag, value, step=step_no)
        if log is not None:
            log.add(tag, value, step_no)
    progress: dict[str, Any] = {"event": "epoch", "epoch": step_no, "epochs": epochs, "loss": round(avg, 6),
                                "lr": lr}
    if val_loss is not None:
        progress["val_loss"] = round(val_loss, 6)
    if val_acc is not None:
        progress["val_accuracy"] = round(val_acc, 6)
    ctx.progress(**progress)
    if not line:
        return
    ctx.log(f"Epoch {step_no}/{epochs} - loss {avg:.4f}"
            + (f" - val_loss {val_loss:.4f}" if val_loss is not None else "")
            + (f" - val_acc {val_acc:.3f}" if val_acc is not None else ""))


@dataclass(frozen=True)
class _LoopSettings:
    """The loop's params, read once."""

    epochs: int
    patience: int
    grad_clip: float
    every_epochs: int
    every_steps: int
    accumulate: int
    max_steps: int
    batch_metrics: bool
    log_interval: int
    log_every_epochs: int
    deterministic: bool
    monitor: str

    @classmethod
    def read(cls, params: dict[str, Any]) -> _LoopSettings:
        return cls(epochs=int(params.get("epochs", 5)),
                   patience=int(params.get("early_stopping_patience") or 0),
                   grad_clip=float(params.get("grad_clip_norm") or 0.0),
                   every_epochs=int(params.get("checkpoint_every") or 0),
                   every_steps=int(params.get("checkpoint_every_steps") or 0),
                   accumulate=max(1, int(params.get("accumulate_steps") or 1)),
                   max_steps=int(params.get("max_steps") or 0),
                   batch_metrics=as_bool(params.get("batch_metrics"), False),
                   log_interval=max(1, int(params.get("log_interval") or 1)),
                   log_every_epochs=epoch_log_every(max(0, int(params.get("log_every_epochs") or 0)),
                                                    int(params.get("epochs", 5))),
                   deterministic=as_bool(params.get("deterministic"), False),
                   monitor=str(params.get("monitor") or "val_loss"))


def _monitoring(loss_fn: Any, val_loader: Any, cfg: _LoopSettings, ctx: RunContext) -> tuple[bool, str]:
    """(whether the loss is a classification loss, the metric early stopping watches)."""
    import torch.nn as nn

    classification = isinstance(loss_fn, (nn.CrossEntropyLoss, nn.NLLLoss))
    monitor = cfg.monitor
    if monitor == "val_accuracy" and cfg.patience > 0 and not (classification and val_loader is not None):
        ctx.warning("monitor", "val_accuracy needs a classification loss and a val_dataloader; "
                    "early stopping watches val_loss instead")
        monitor = "val_loss"
    return classification, monitor


class TrainingLoopNode(Node):
    NODE_NAME = "TrainingLoop"
    CACHEABLE = False  # training: changes the weights it is given, emits metrics
    CATEGORY = "Training"
    DESCRIPTION = ("Run a training loop with optional validation, early stopping, learning "
                   "rate scheduling, and gradient clipping.")

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [
            Port("model", MODEL, "Model to train"),
            Port("dataloader", DATALOADER, "Training data loader"),
            Port("optimizer", OPTIMIZER, "Optimizer for parameter updates"),
            Port("loss_fn", LOSS_FN, "Loss function"),
            Port("val_dataloader", DATALOADER, "Validation data loader", optional=True),
            Port("lr_scheduler", ANY, "Learning rate scheduler", optional=True),
            Port("start_epoch", SCALAR, "Resume from this epoch (0-based); wire CheckpointLoader.epoch",
                 optional=True),
            Port("grad_scaler_state", ANY, "fp16 loss-scale state to resume from", optional=True),
        ]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("model", MODEL, "Trained model (best if early stopping)"),
            Port("losses", TENSOR, "Training loss per epoch"),
            Port("val_losses", TENSOR, "Validation loss per epoch (empty if no val_dataloader)"),
            Port("metrics", ANY, "Training metrics dict (final_train_loss, best_epoch, lr_history, ...)"),
            Port("grad_scaler_state", ANY, "fp16 loss-scale state (None unless precision is fp16)"),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("epochs", "int", 5, "Number of training epochs", min_value=1),
            Param("device", "select", "auto", "Device to train on ('auto' follows the run's device)",
                  options=list(DEVICE_OPTIONS)),
            Param("early_stopping_patience", "int", 0,
                  "Stop if the monitored metric doesn't improve for N epochs (0 = disabled)", min_value=0),
            Param("monitor", "select", "val_loss", "Metric early stopping watches (val_accuracy: "
                  "classification loss with a val_dataloader only)", options=["val_loss", "val_accuracy"]),
            Param("checkpoint_every", "int", 0, "Save a checkpoint every N completed epochs into the "
                  "run folder (0 = disabled)", min_value=0, writes=True),
            Param("checkpoint_every_steps", "int", 0, "Save a checkpoint every N optimizer steps into "
                  "the run folder (0 = disabled)", min_value=0, writes=True),
            Param("grad_clip_norm", "float", 0.0, "Max gradient norm for clipping (0 = disabled)",
                  min_value=0.0),
            Param("batch_metrics", "bool", False, "Also record every batch's loss as 'train_loss_batch'"),
            Param("precision", "select", "fp32", "Mixed precision; a device that cannot honour it "
                  "trains in fp32 and says so", options=list(PRECISIONS), advanced=True),
            Param("accumulate_steps", "int", 1, "Batches per optimizer step (gradient accumulation)",
                  min_value=1, advanced=True),
            Param("max_steps", "int", 0, "Stop after this many optimizer steps in total (0 = no limit)",
                  min_value=0, advanced=True),
            Param("log_interval", "int", 1, "Record every Nth batch when batch metrics are on",
                  min_value=1, advanced=True),
            Param("log_every_epochs", "int", 0, "Log the 'Epoch N/M' line every N epochs (0 = auto: every "
                  "epoch up to 20, then about 20 lines; the first, last and stopping epochs are always "
                  "logged, and every epoch's metrics are recorded)", min_value=0, advanced=True),
            Param("deterministic", "bool", False, "Ask torch for deterministic kernels", advanced=True),
            Param("tensorboard", "bool", False, "Also write the metrics for TensorBoard into the run "
                  "folder (listed as a run artifact)", advanced=True, writes=True),
            Param("strategy", "select", "single", "single: one process; ddp: DistributedDataParallel across "
                  "this machine's devices (gloo on CPU, nccl on CUDA), never across machines",
                  options=list(STRATEGIES), advanced=True),
            Param("ddp_processes", "int", 0, "ddp: processes to train with (0 = one per CUDA card the run "
                  "has, or 1 on a CPU)", min_value=0, advanced=True),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        for name in ("model", "dataloader", "optimizer", "loss_fn"):
            if inputs.get(name) is None:
                raise ValueError(f"TrainingLoop requires the `{name}` input")
        strategy = str(params.get("strategy") or "single")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
        if strategy == "ddp":
            devices = _ddp.world_devices(int(params.get("ddp_processes") or 0),
                                         resolve_device(params.get("device"), ctx), ctx.device_set)
            ctx.log(f"strategy ddp: {len(devices)} process(es) on {', '.join(devices)}")
            return _ddp.run(self._logged, inputs, params, ctx, devices)
        return self._logged(inputs, params, ctx, None)

    def _logged(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext,
                dist: Dist | None) -> dict[str, Any]:
        """The loop with its TensorBoard log, written by the reporting process only."""
        log = None
        if as_bool(params.get("tensorboard"), False) and (dist is None or dist.main):
            log = ScalarLog(ctx.run_dir() / "tensorboard", ctx.now)
        try:
            return self._train(inputs, params, ctx, log, dist)
        finally:
            # Also on a stop or a crash: the partial curves are what gets looked at.
            if log is not None:
                log.close()
                ctx.artifact("tensorboard", log.folder, "tensorboard")

    def _train(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext,
               log: ScalarLog | None, dist: Dist | None = None) -> dict[str, Any]:
        import torch

        device = dist.device if dist is not None else resolve_device(params.get("device"), ctx)
        model = inputs["model"].to(device)
        # The module that trains: under ddp its wrapper, which averages the gradients.
        net = dist.wrap(model) if dist is not None else model
        loss_fn = to_device(inputs["loss_fn"], device)
        optimizer = bind_optimizer(inputs["optimizer"], model, ctx)
        dataloader, val_loader = inputs["dataloader"], inputs.get("val_dataloader")
        if dist is not None:
            dataloader = dist.shard(dataloader)
        scheduler = inputs.get("lr_scheduler")
        if scheduler is not None and getattr(scheduler, "optimizer", optimizer) is not optimizer:
            scheduler.optimizer = optimizer

        start = _start_epoch(inputs.get("start_epoch"), ctx)
        cfg = _LoopSettings.read(params)
        epochs, patience, grad_clip = cfg.epochs, cfg.patience, cfg.grad_clip
        every_epochs, every_steps, accumulate = cfg.every_epochs, cfg.every_steps, cfg.accumulate
        max_steps, batch_metrics, log_interval = cfg.max_steps, cfg.batch_metrics, cfg.log_interval
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        policy = AmpPolicy(params.get("precision"), device, ctx)
        policy.load_state_dict(inputs.get("grad_scaler_state"))
        classification, monitor = _monitoring(loss_fn, val_loader, cfg, ctx)
        if start >= epochs:
            ctx.warning("start_epoch", f"start_epoch={start} is at or past epochs={epochs}; no epoch runs")

        # Not ctx.run_dir(): that creates the folder, and most runs write nothing.
        ckpt_dir = ctx.layout.run_dir(ctx.run_id) / "checkpoints"
        losses: list[float] = []
        val_losses: list[float] = []
        lr_history: list[float] = []
        best_score: float | None = None
        best_epoch, best_state, bad_epochs = 0, None, 0
        global_batch = steps = 0
        budget_spent = stopped_early = False
        last_progress = ctx.now()

        def save(name: str, completed: int) -> Path:
            path = write_checkpoint(checkpoint_payload(model, optimizer, completed, losses, scheduler,
                                                       policy.state_dict()), ckpt_dir / name)
            ctx.artifact("checkpoint", path, name)
            return path

        def stop(completed: int) -> None:
            optimizer.zero_grad(set_to_none=True)
            if dist is None or dist.main:
                save("interrupt.pt", completed)
            ctx.log(f"Stopped; saved {completed} complete epoch(s) to checkpoints/interrupt.pt", "warning")
            raise RunStopped()

        def apply_gradients() -> None:
            nonlocal steps
            if grad_clip > 0:
                policy.unscale(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            if policy.step(optimizer):
                steps += 1
                if every_steps and steps % every_steps == 0 and (dist is None or dist.main):
                    save(f"step-{steps}.pt", epoch)
            optimizer.zero_grad()

        total_batches = len(dataloader) if hasattr(dataloader, "__len__") else None
        for epoch in range(start, epochs):
            model.train()
            running, count, pending = 0.0, 0, 0
            optimizer.zero_grad()
            for batch_index, batch in enumerate(dataloader):
                if ctx.should_stop():
                    stop(epoch)
                data, targets = _split_batch(batch, device)
                with policy.autocast():
                    outputs = net(data)
                    loss = loss_fn(outputs, targets) if targets is not None else loss_fn(outputs)
                policy.backward(loss / accumulate)
                pending += 1
                batch_loss = float(loss.item())
                running, count, global_batch = running + batch_loss, count + 1, global_batch + 1
                if pending >= accumulate:
                    apply_gradients()
                    pending = 0
                if batch_metrics and global_batch % log_interval == 0:
                    ctx.metric("train_loss_batch", batch_loss, step=global_batch)
                now = ctx.now()
                if now - last_progress >= BATCH_PROGRESS_INTERVAL_S:
                    last_progress = now
                    ctx.progress(event="batch", epoch=epoch + 1, epochs=epochs, batch=batch_index + 1,
                                 batches=total_batches, loss=round(batch_loss, 6))
                if max_steps and steps >= max_steps:
                    budget_spent = True
                    break
            if pending and not budget_spent:
                apply_gradients()
                budget_spent = bool(max_steps and steps >= max_steps)
            optimizer.zero_grad()

            avg = running / max(count, 1)
            if dist is not None:
                avg = dist.mean(avg)  # every rank's shard: the epoch's loss over all the data
            losses.append(avg)
            lr = float(optimizer.param_groups[0].get("lr", 0.0))
            lr_history.append(lr)

            val_loss = val_acc = None
            if val_loader is not None:
                # a stop during validation keeps this epoch: its training is complete
                val_loss, val_acc = _validate(model, val_loader, loss_fn, policy, device, classification,
                                              ctx, functools.partial(stop, epoch + 1))
                val_losses.append(val_loss)

            if scheduler is not None and hasattr(scheduler, "step"):
                if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                    scheduler.step(val_loss if val_loss is not None else avg)
                else:
                    scheduler.step()

            if patience > 0:
                if monitor == "val_accuracy" and val_acc is not None:
                    score = -val_acc  # lower is better for the comparison below
                else:
                    score = val_loss if val_loss is not None else avg
                if best_score is None or score < best_score:
                    best_score, best_epoch, bad_epochs = score, epoch + 1, 0
                    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                else:
                    bad_epochs += 1
                stopped_early = bad_epochs >= patience

            step_no = epoch + 1
            line = (step_no % cfg.log_every_epochs == 0 or step_no in (start + 1, epochs) or stopped_early
                    or budget_spent)
            _report_epoch(ctx, log, step_no, epochs, avg, lr, val_loss, val_acc,
                          {"patience_counter": bad_epochs, "best_epoch": best_epoch} if patience > 0 else {}, line)

            if every_epochs and step_no % every_epochs == 0 and (dist is None or dist.main):
                save(f"epoch-{step_no}.pt", step_no)
            if stopped_early:
                ctx.log(f"Early stopping at epoch {step_no} (best epoch {best_epoch})")
                break
            if budget_spent:
                ctx.log(f"max_steps={max_steps} reached at epoch {step_no}")
                break
            if ctx.should_stop():
                stop(step_no)

        if best_state is not None:
            model.load_state_dict(best_state)
        metrics = {
            "final_train_loss": losses[-1] if losses else 0.0,
            "final_val_loss": val_losses[-1] if val_losses else None,
            "best_epoch": best_epoch if patience > 0 else start + len(losses),
            "total_epochs_run": len(losses),
            "start_epoch": start,
            "stopped_early": stopped_early,
            "optimizer_steps": steps,
            "lr_history": lr_history,
            "precision": policy.precision,
            "strategy": "ddp" if dist is not None else "single",
        }
        if dist is not None:
            metrics["ddp_processes"] = dist.world
        if policy.scaler is not None:
            metrics["skipped_steps"] = policy.skipped_steps
        return {
            "model": model,
            "losses": torch.tensor(losses, dtype=torch.float32),
            "val_losses": torch.tensor(val_losses, dtype=torch.float32),
            "metrics": metrics,
            "grad_scaler_state": policy.state_dict(),
        }
