"""Stock PyTorch training on the device against PyTorch on the CPU: a Linear layer's backward pass
and a few SGD steps of a tiny MLP. Run under xpu-run (the sim backend needs the host kernels of
tests/torch_sim_kernels.py); prints one JSON line: per check, the largest difference from the
CPU's result (or the error it raised).

Every input is made on the CPU with a fixed seed and copied to the device, so the device needs
no random-number kernels.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch_checks import check, diff, report

torch.manual_seed(0)


def linear_grads(device: str) -> dict[str, torch.Tensor]:
    """Gradients of a Linear layer's weight, bias and input, from the same seeded start."""
    torch.manual_seed(1)
    layer, x, upstream = nn.Linear(12, 7), torch.randn(5, 12), torch.randn(5, 7)
    layer = layer.to(device)
    x = x.to(device).requires_grad_()
    (layer(x) * upstream.to(device)).sum().backward()
    return {"weight": layer.weight.grad, "bias": layer.bias.grad, "input": x.grad}


def train(model: nn.Module, device: str, momentum: float, steps: int = 2) -> tuple[list[float], list[torch.Tensor]]:
    """Losses of `steps` SGD steps of a copy of `model` on `device`, and its final parameters."""
    torch.manual_seed(2)
    x, y = torch.randn(10, 8), torch.randn(10, 4)
    model = copy.deepcopy(model).to(device)
    x, y = x.to(device), y.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


cpu_grads = linear_grads("cpu")
device_grads: dict[str, torch.Tensor] = {}


@check("linear_backward_weight")
def _() -> float:
    device_grads.update(linear_grads("cuda"))
    return diff(device_grads["weight"], cpu_grads["weight"])


for part in ("bias", "input"):
    @check(f"linear_backward_{part}")
    def _(part: str = part) -> float:
        return diff(device_grads[part], cpu_grads[part])


torch.manual_seed(3)
mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
runs: dict[tuple[str, float], tuple[list[float], list[torch.Tensor]]] = {}


def run(device: str, momentum: float) -> tuple[list[float], list[torch.Tensor]]:
    if (device, momentum) not in runs:
        runs[device, momentum] = train(mlp, device, momentum)
    return runs[device, momentum]


def params_diff(momentum: float) -> float:
    return max(diff(d, c) for d, c in zip(run("cuda", momentum)[1], run("cpu", momentum)[1], strict=True))


for step in (1, 2):
    @check(f"mlp_loss_step{step}")
    def _(step: int = step) -> float:
        return abs(run("cuda", 0.0)[0][step - 1] - run("cpu", 0.0)[0][step - 1])


@check("mlp_params_after")
def _() -> float:
    return params_diff(0.0)


@check("mlp_momentum_params_after")
def _() -> float:
    return params_diff(0.9)


FOREACH_ROUNDS = 200  # the test counts the launches that reached the client core


@check("foreach_add_many")
def _() -> float:
    """Many launches of one foreach kernel: its argument bytes (a TensorListMetadata) are about 25 KiB."""
    lists = {device: [torch.full((n,), 0.5, device=device) for n in (3, 70, 1000)] for device in ("cpu", "cuda")}
    for tensors in lists.values():
        for i in range(FOREACH_ROUNDS):
            torch._foreach_add_(tensors, float(i % 7))
    return max(diff(d, c) for d, c in zip(lists["cuda"], lists["cpu"], strict=True))


if __name__ == "__main__":
    report()
