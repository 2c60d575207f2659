"""NVIDIA's own libcudart (12.x and 13.x, from the runtime wheels) over the shim and the session's server.

Each test runs tests/programs/cudart_check.py in a subprocess with the shim preloaded; that
script loads the runtime with ctypes, runs one sub-test and prints its findings as JSON.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import DEVICE_NAME
from toolchain import FETCHED_CUDARTS, cudart_path, fetch_cudart

SCRIPT = Path(__file__).resolve().parent / "programs" / "cudart_check.py"
SIZES = ("1", "7", "4096", "65537", str((1 << 20) + 3), str(64 << 20))
CUDA_ERROR_INVALID_DEVICE = 101


@pytest.fixture(params=[12, 13, *FETCHED_CUDARTS],
                ids=["cudart12", "cudart13", *(f"cudart{v}" for v in FETCHED_CUDARTS)])
def cudart(request: pytest.FixtureRequest) -> str:
    """The pinned runtimes of the test extra (the newest 12.x, the oldest 13.x), and those fetched: the oldest
    12.x tested and the newest 13.x (13.4 and later need the tools context)."""
    if isinstance(request.param, str):
        path, why = fetch_cudart(request.param)
        if path is None:
            pytest.skip(why)
        return path
    path = cudart_path(request.param)
    if path is None:
        pytest.skip(f"the CUDA {request.param} runtime wheel is not installed")
    return path


def run_check(run: Callable[[list[str]], subprocess.CompletedProcess], cudart: str, subtest: str) -> dict[str, Any]:
    """The sub-test's JSON result, run by `run` (under the shim); fails (AssertionError) if the program failed.
    bench/runtimes.py calls the tests below with this too, on every runtime of the package index."""
    proc = run([sys.executable, str(SCRIPT), cudart, subtest])
    lines = proc.stdout.strip().splitlines()
    assert lines, f"{subtest}: no output (exit {proc.returncode})\nstderr:\n{proc.stderr}"
    result = json.loads(lines[-1])
    assert proc.returncode == 0 and result["ok"], f"{subtest}: {result}\nstderr:\n{proc.stderr}"
    return result


@pytest.fixture
def check(run_on, cudart: str) -> Callable[[str], dict[str, Any]]:
    """check(subtest) -> the sub-test's JSON result; fails the test if the program failed."""
    return functools.partial(run_check, functools.partial(run_on, timeout=300), cudart)


def test_device_count_and_properties(check) -> None:
    r = check("properties")
    assert r["count"] == 1
    assert DEVICE_NAME in r["name"]
    assert (r["major"], r["minor"]) == (9, 0)
    assert (r["prop_major"], r["prop_minor"]) == (9, 0)
    assert r["total_global_mem"] == r["mem_info_total"] > 0
    assert 0 < r["mem_info_free"] <= r["mem_info_total"]


def test_malloc_memcpy_memset_round_trips(check) -> None:
    sizes = check("roundtrip")["sizes"]
    assert sorted(sizes, key=int) == list(SIZES)
    for size, found in sizes.items():
        assert found == {"copy_mismatch_at": None, "memset_mismatch_at": None}, size


def test_stream_async_copies_events_and_query(check) -> None:
    r = check("stream")
    assert r["async_mismatch_at"] is None
    assert r["d2d_mismatch_at"] is None
    assert r["d2d_async_mismatch_at"] is None
    assert r["memset_async_mismatch_at"] is None
    assert r["stream_query"] == 0  # cudaSuccess: the stream was synchronised
    assert r["elapsed_ms"] >= 0


def test_pinned_memory_async_copy(check) -> None:
    assert check("pinned")["mismatch_at"] is None


def test_pointer_attributes(check) -> None:
    r = check("pointer_attributes")
    for label in ("device", "device_inner"):
        attrs = r[label]
        assert attrs["type"] == 2, label  # cudaMemoryTypeDevice
        assert attrs["device"] == 0
        assert attrs["device_pointer"] == attrs["ptr"]
    pinned = r["pinned"]
    assert pinned["type"] == 1  # cudaMemoryTypeHost
    assert pinned["host_pointer"] == pinned["ptr"]


def test_eight_threads(check) -> None:
    r = check("threads")
    assert r["failures"] == []
    assert r["rounds"] == [25] * 8


def test_errors(check) -> None:
    r = check("errors")
    assert r["copy_after_free"] != 0, r
    assert r["set_device_99"] == CUDA_ERROR_INVALID_DEVICE, r
    assert r["set_device_99_name"] == "cudaErrorInvalidDevice"
    assert r["still_works"]
