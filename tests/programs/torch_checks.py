"""The harness of the torch_*_check.py programs: each check is a function returning the largest
difference between the device's result and the CPU's; `report()` prints them as one JSON line,
an error's text in place of a number."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch

results: dict[str, Any] = {}


def check(name: str) -> Callable[[Callable[[], float]], None]:
    def run(fn: Callable[[], float]) -> None:
        print(f"check {name}", file=sys.stderr, flush=True)  # which one, should the process die
        try:
            results[name] = float(fn())
        except Exception as exc:  # noqa: BLE001 - reported in the JSON, for the test to show
            results[name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"

    return run


def diff(device: torch.Tensor, cpu: torch.Tensor) -> float:
    return (device.detach().cpu().double() - cpu.detach().double()).abs().max().item()


def rel(device: torch.Tensor, cpu: torch.Tensor) -> float:
    return diff(device, cpu) / max(cpu.double().abs().max().item(), 1e-30)


def report() -> None:
    print(json.dumps(results))
