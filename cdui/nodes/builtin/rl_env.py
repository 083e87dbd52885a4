"""CodefyUI's reinforcement-learning nodes: the DQN and PPO networks (torch
only) and EnvWrapper, which makes a gymnasium environment (the `rl` extra).

Environments whose simulator is a separate package that cannot be installed
offline (Atari through ale-py and its ROMs, MuJoCo's robots) are refused at
validation naming that package, before any node runs, rather than failing
inside ``gymnasium.make`` at run time.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from cdui.nodes.base import ANY, MODEL, Param, Port, package_available
from cdui.nodes.builtin._declared import DeclaredNode, I, T, int_param

if TYPE_CHECKING:  # pragma: no cover
    from cdui.core.layout import Layout
    from cdui.graph.context import RunContext

RL = "RL"
MAX_WIDTH = 65536
# gymnasium ids whose simulator lives in another package: (pattern, import name, pip name, what it is).
SIMULATORS = (
    (re.compile(r"^ALE/|NoFrameskip|^(Pong|Breakout|SpaceInvaders|Seaquest|Qbert|Enduro)-v\d"),
     "ale_py", "ale-py", "the Arcade Learning Environment with its Atari ROMs"),
    (re.compile(r"^(Humanoid|HumanoidStandup|Ant|HalfCheetah|Hopper|Walker2d|Swimmer|Reacher|Pusher|"
                r"InvertedPendulum|InvertedDoublePendulum)-v\d"),
     "mujoco", "mujoco", "the MuJoCo physics simulator"),
)


def _width(params: dict[str, Any], name: str, default: int) -> int:
    value = int_param(params, name, default)
    if not 1 <= value <= MAX_WIDTH:
        raise ValueError(f"{name} must be within 1..{MAX_WIDTH}, got {value}")
    return value


class DQNNode(DeclaredNode):
    NODE_NAME, CATEGORY = "DQN", RL
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "A Q-network Linear-ReLU-Linear-ReLU-Linear, and Q-values for the state when given"
    INPUTS = (T("state", "States [B, state_dim]", optional=True),)
    OUTPUTS = (Port("model", MODEL, "The Q-network (keys 0.*, 2.*, 4.*)"),
               T("action", "Q-values per action (zeros without a state)"))
    PARAMS = (I("state_dim", 4, "State width"), I("action_dim", 2, "Number of actions"),
              I("hidden_dim", 128, "Hidden width"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch
        import torch.nn as nn

        s, a, h = (_width(params, "state_dim", 4), _width(params, "action_dim", 2),
                   _width(params, "hidden_dim", 128))
        # Fresh torch-default weights on every run, as in CodefyUI.
        model = nn.Sequential(nn.Linear(s, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, a))
        if inputs.get("state") is None:
            return {"model": model, "action": torch.zeros(a)}
        state = self.float_tensor(inputs, "state")
        if state.shape[-1] != s:
            raise ValueError(f"DQN: state of shape {tuple(state.shape)} does not end in state_dim={s}")
        model = model.to(state.device)
        with torch.no_grad():
            return {"model": model, "action": model(state)}


def build_actor_critic(s: int, a: int, h: int) -> Any:
    import torch
    import torch.nn as nn

    class ActorCritic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = nn.Sequential(nn.Linear(s, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh())
            self.actor = nn.Linear(h, a)
            self.critic = nn.Linear(h, 1)

        def forward(self, x: Any) -> tuple[Any, Any]:
            features = self.shared(x)
            return torch.softmax(self.actor(features), dim=-1), self.critic(features)

    return ActorCritic()


class PPONode(DeclaredNode):
    NODE_NAME, CATEGORY = "PPO", RL
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "An actor-critic network (shared Tanh MLP, softmax policy, value head)"
    INPUTS = (T("state", "States [B, state_dim]", optional=True),)
    OUTPUTS = (Port("model", MODEL, "The actor-critic (keys shared.*, actor.*, critic.*)"),
               T("action", "Action probabilities (zeros without a state)"))
    PARAMS = (I("state_dim", 4, "State width"), I("action_dim", 2, "Number of actions"),
              I("hidden_dim", 64, "Hidden width"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        s, a, h = (_width(params, "state_dim", 4), _width(params, "action_dim", 2),
                   _width(params, "hidden_dim", 64))
        model = build_actor_critic(s, a, h)
        if inputs.get("state") is None:
            return {"model": model, "action": torch.zeros(a)}
        state = self.float_tensor(inputs, "state")
        if state.shape[-1] != s:
            raise ValueError(f"PPO: state of shape {tuple(state.shape)} does not end in state_dim={s}")
        model = model.to(state.device)
        with torch.no_grad():
            probs, _value = model(state)
        return {"model": model, "action": probs}


def simulator_needed(env_name: str) -> tuple[str, str, str] | None:
    """(import name, pip name, description) of the simulator package an env id needs, if any."""
    for pattern, module, pip, what in SIMULATORS:
        if pattern.search(env_name):
            return module, pip, what
    return None


class EnvWrapperNode(DeclaredNode):
    NODE_NAME, CATEGORY = "EnvWrapper", RL
    CACHEABLE = False  # a live object training changes in place
    DESCRIPTION = "Makes a gymnasium environment and resets it: the env and its first observation"
    NEEDS, EXTRA = ("gymnasium",), "rl"
    OUTPUTS = (Port("env", ANY, "The environment object"), T("observation", "First observation (float32)"))
    PARAMS = (Param("env_name", "string", "CartPole-v1", "gymnasium environment id"),)

    @classmethod
    def preflight(cls, params: dict[str, Any], layout: Layout) -> list[tuple[str, str]]:
        problems = super().preflight(params, layout)
        env_name = str(params.get("env_name") or "CartPole-v1")
        sim = simulator_needed(env_name)
        if sim is not None and not package_available(sim[0]):
            problems.append(("missing_extra", (
                f"environment {env_name!r} needs {sim[1]} ({sim[2]}), which is not installed on this machine; "
                f"cdui does not install it (it is not part of any extra and needs files from the internet): "
                f"install {sim[1]} into cdui's environment yourself, or pick an environment gymnasium ships "
                f"(CartPole-v1, Acrobot-v1, MountainCar-v0, Pendulum-v1)")))
        return problems

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import gymnasium
        import torch

        env_name = str(params.get("env_name") or "CartPole-v1")
        try:
            env = gymnasium.make(env_name)
        except Exception as exc:  # gymnasium raises its own error types for unknown or broken ids
            raise ValueError(f"EnvWrapper: gymnasium cannot make {env_name!r}: {exc}") from None
        observation, _info = env.reset()
        return {"env": env, "observation": torch.as_tensor(observation, dtype=torch.float32)}

