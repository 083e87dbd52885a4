"""DiffusionTrainingLoop: train a noise predictor as DDPM does.

Each batch: clean images x0 (the first element of each dataset item; labels
are ignored), timesteps t drawn uniformly from 0..T-1, noise eps, the noised
images ``x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps``, and the loss
``mean((model(x_t, t) - eps)^2)`` minimised with Adam. The schedule is the one
DDPMSampler uses (``ddpm_betas``), so the same params give a matching sampler.
As in CodefyUI, ``seed`` seeds torch's global generator and the DataLoader
shuffles.

Reporting and stopping follow TrainingLoop: a ``batch`` progress event at most
once a second, then after every epoch the ``train_loss`` metric and an
``epoch`` progress event with the losses so far. ``ctx.should_stop()`` is
polled before every batch and between epochs; on a stop the node writes
``<run>/checkpoints/interrupt.pt`` (the model, Adam's state and the number of
complete epochs), records it as a ``checkpoint`` artifact and raises
``RunStopped``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdui.graph.context import RunStopped
from cdui.nodes.base import DATASET, MODEL, Param, Port
from cdui.nodes.builtin._declared import DeclaredNode, F, I, T, float_param, int_param
from cdui.nodes.builtin._util import resolve_device
from cdui.nodes.builtin.diffusion_unet import ddpm_betas
from cdui.nodes.builtin.training_loop import checkpoint_payload, write_checkpoint

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

BATCH_PROGRESS_INTERVAL_S = 1.0


class DiffusionTrainingLoopNode(DeclaredNode):
    NODE_NAME, CATEGORY = "DiffusionTrainingLoop", "Diffusion"
    CACHEABLE = False  # training: changes the weights it is given, emits metrics
    DESCRIPTION = ("Train a denoising model (e.g. DiffusionUNet) to predict the noise added at random timesteps "
                   "(DDPM); use the same schedule in DDPMSampler")
    INPUTS = (Port("model", MODEL, "Noise predictor: forward(x, t) returns the predicted noise"),
              Port("dataset", DATASET, "Clean images; each item's first element is the image, labels are ignored"))
    OUTPUTS = (Port("model", MODEL, "The trained model"), T("losses", "Mean training loss of each epoch"))
    PARAMS = (I("epochs", 200, "Epochs", lo=1), I("batch_size", 32, "Images per batch", lo=1),
              F("lr", 0.002, "Adam learning rate", lo=0.0),
              I("num_timesteps", 160, "Diffusion steps T (DDPMSampler's num_steps must match)", lo=2),
              Param("schedule", "select", "linear", "Noise schedule (must match DDPMSampler)",
                    options=["linear", "cosine"]),
              F("beta_start", 0.0001, "First beta of the linear schedule", lo=0.0),
              F("beta_end", 0.05, "Last beta of the linear schedule", lo=0.0),
              Param("device", "select", "cpu", "Device to train on", options=["cpu", "cuda"]),
              I("seed", 0, "Seed of torch's generator (timesteps, noise, shuffling)"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch
        from torch.utils.data import DataLoader


        model, dataset = inputs.get("model"), inputs.get("dataset")
        if model is None:
            raise ValueError("DiffusionTrainingLoop requires a `model` input")
        if dataset is None:
            raise ValueError("DiffusionTrainingLoop requires a `dataset` input")
        epochs = int_param(params, "epochs", 200)
        batch_size = max(1, int_param(params, "batch_size", 32))
        steps = int_param(params, "num_timesteps", 160)
        schedule = str(params.get("schedule") or "linear")
        if schedule not in ("linear", "cosine"):
            raise ValueError(f"DiffusionTrainingLoop: schedule must be linear or cosine, got {schedule!r}")
        device = resolve_device(params.get("device") or "cpu", ctx)

        torch.manual_seed(int_param(params, "seed", 0))
        betas = ddpm_betas(schedule, steps, float_param(params, "beta_start", 0.0001),
                           float_param(params, "beta_end", 0.05))
        alpha_bars = torch.cumprod(1.0 - betas, dim=0).to(device)
        model = model.to(device)
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=float_param(params, "lr", 0.002))
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
        total_batches = len(loader)
        losses: list[float] = []
        last_progress = ctx.now()

        def stop() -> None:
            path = write_checkpoint(checkpoint_payload(model, optimizer, len(losses), losses),
                                    ctx.layout.run_dir(ctx.run_id) / "checkpoints" / "interrupt.pt")
            ctx.artifact("checkpoint", path, path.name)
            ctx.log(f"Stopped; saved {len(losses)} complete epoch(s) to checkpoints/interrupt.pt", "warning")
            raise RunStopped()

        for epoch in range(epochs):
            running, batches = 0.0, 0
            for index, batch in enumerate(loader):
                if ctx.should_stop():
                    stop()
                x0 = (batch[0] if isinstance(batch, (list, tuple)) else batch).to(device).float()
                b = x0.shape[0]
                t = torch.randint(0, steps, (b,), device=device)
                eps = torch.randn_like(x0)
                ab = alpha_bars[t].view(b, *([1] * (x0.dim() - 1)))
                loss = ((model(torch.sqrt(ab) * x0 + torch.sqrt(1.0 - ab) * eps, t) - eps) ** 2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                batch_loss = float(loss.detach())
                running, batches = running + batch_loss, batches + 1
                now = ctx.now()
                if now - last_progress >= BATCH_PROGRESS_INTERVAL_S:
                    last_progress = now
                    ctx.progress(event="batch", epoch=epoch + 1, epochs=epochs, batch=index + 1,
                                 batches=total_batches, loss=round(batch_loss, 6))
            avg = running / max(batches, 1)
            losses.append(avg)
            ctx.metric("train_loss", avg, step=epoch + 1)
            ctx.progress(event="epoch", epoch=epoch + 1, epochs=epochs, loss=round(avg, 6),
                         losses=[round(v, 6) for v in losses])
            if ctx.should_stop():
                stop()
        return {"model": model, "losses": torch.tensor(losses, dtype=torch.float32)}
