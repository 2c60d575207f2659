"""Every NVIDIA CUDA runtime on the package index from 12.4 on, through the shim against a sim server.

    python bench/runtimes.py [--out bench/results/runtimes.json] [--versions 12.4.99,13.5.37]

Lists the releases of `nvidia-cuda-runtime-cu12` (12.x, from 12.4 on) and `nvidia-cuda-runtime` (13.x)
with `pip index versions --json` (pre-releases left out), fetches the libcudart of each into the tests'
cache (tests/toolchain.py `fetch_cudart`: pip downloads the wheel once), and runs on each the checks of
tests/test_cudart.py, that is every sub-test of tests/programs/cudart_check.py in a fresh process with
the shim preloaded as `xpu-run` preloads it, against an `xpu-server --backend sim` of its own on
loopback (one per runtime, so that a runtime which upsets the server does not fail the next).
Prints a table of runtime x sub-test, pass or FAIL, and the failures; with --out, the JSON
(every check's result or failure) and a Markdown file beside it. Exit status 1 when a check failed
or a runtime could not be fetched. Needs pip to reach the index (about 1 MiB a wheel); some
7 seconds a runtime after that.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]
import test_cudart  # noqa: E402
from foundation import start_server, stop  # noqa: E402
from toolchain import RUNTIME_WHEELS, fetch_cudart  # noqa: E402

OLDEST = (12, 4)
# the tests of tests/test_cudart.py, each of which runs one sub-test through its `check` argument
TESTS = [f for name, f in vars(test_cudart).items() if name.startswith("test_") and callable(f)]


def key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def index_versions() -> list[str]:
    """The runtime's releases on the index, oldest first: each major from the package that has its layout."""
    found = []
    for major, (package, _) in RUNTIME_WHEELS.items():
        proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "--json", package],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode:
            raise SystemExit(f"pip index versions {package} failed: {proc.stderr.strip()}")
        versions = json.loads(proc.stdout)["versions"]  # releases only: pip leaves out rc and dev without --pre
        found += [v for v in versions if key(v)[0] == major and key(v)[:2] >= OLDEST]
    return sorted(found, key=key)


def run_tests(lib: str, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each test of test_cudart on the runtime `lib`: {sub-test: {"ok", and "result" or "failure"}}."""
    run = functools.partial(subprocess.run, env=env, capture_output=True, text=True, timeout=300)
    return dict(run_test(test, functools.partial(test_cudart.run_check, run, lib)) for test in TESTS)


def run_test(test: Callable[..., None], check: Callable[[str], dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """(the sub-test `test` ran, its outcome), `test` being given a `check` that notes what it ran."""
    seen: dict[str, Any] = {}

    def noted(subtest: str) -> dict[str, Any]:
        seen["subtest"] = subtest
        seen["result"] = check(subtest)
        return seen["result"]

    try:
        test(noted)
        outcome = {"ok": True, "result": seen["result"]}
    except (AssertionError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        outcome = {"ok": False, "failure": f"{test.__name__}: {exc}"[:4000]}
    return seen.get("subtest", test.__name__), outcome


def one_runtime(version: str, shim_env: Callable[[str], dict[str, str]], tmp: Path) -> dict[str, Any]:
    start = time.monotonic()
    lib, why = fetch_cudart(version)
    if lib is None:
        return {"version": version, "fetched": False, "why": why, "tests": {}}
    log = tmp / f"server-{version}.log"
    server, address = start_server(log, "sim")
    try:
        tests = run_tests(lib, shim_env(address))
    finally:
        stop(server)
    row = {"version": version, "fetched": True, "tests": tests,
           "seconds": round(time.monotonic() - start, 1)}
    if not all(t["ok"] for t in tests.values()):
        row["server_log_tail"] = log.read_text(errors="replace").splitlines()[-30:]
    return row


def passed(row: dict[str, Any]) -> bool:
    return row["fetched"] and all(t["ok"] for t in row["tests"].values())


def markdown(report: dict[str, Any]) -> str:
    rows = report["runtimes"]
    subtests = list(dict.fromkeys(s for row in rows for s in row["tests"]))
    lines = ["# NVIDIA's CUDA runtimes through xpuremote (sim backend)\n",
             f"`{report['command']}`, {report['when']}, {report['machine']}.\n",
             f"{sum(map(passed, rows))} of {len(rows)} runtimes pass every check of tests/test_cudart.py.\n",
             "| runtime | package | " + " | ".join(subtests) + " | s |",
             "|---|---|" + "---|" * len(subtests) + "---|"]
    for row in rows:
        package = RUNTIME_WHEELS[key(row["version"])[0]][0]
        if not row["fetched"]:
            lines.append(f"| {row['version']} | {package} | not fetched: {row['why']} |")
            continue
        cells = ["pass" if row["tests"][s]["ok"] else "FAIL" for s in subtests]
        lines.append(f"| {row['version']} | {package} | " + " | ".join(cells) + f" | {row['seconds']} |")
    failures = [f"- {row['version']}: {t['failure'].splitlines()[0]}" for row in rows for t in row["tests"].values()
                if not t["ok"]]
    if failures:
        lines += ["", "Failures (their first line; the JSON has all of it, and the server's log):", "", *failures]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON here, Markdown beside it")
    parser.add_argument("--versions", help="these runtimes (comma-separated) instead of every one on the index")
    args = parser.parse_args(argv)
    from xpuremote.interpose.build import ensure_shim
    from xpuremote.interpose.run import child_env

    shim_dir = str(ensure_shim().parent)
    versions = args.versions.split(",") if args.versions else index_versions()
    report: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M:%S"),
                              "command": " ".join(["python bench/runtimes.py", *(argv or sys.argv[1:])]),
                              "machine": f"{platform.platform()}, {os.cpu_count()} cpus", "runtimes": []}
    with tempfile.TemporaryDirectory() as tmp:
        for version in versions:
            row = one_runtime(version, functools.partial(child_env, shim_dir), Path(tmp))
            report["runtimes"].append(row)
            print(f"{version}: {'pass' if passed(row) else 'FAIL'}", file=sys.stderr, flush=True)
    text = markdown(report)
    print(text)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(text)
    return 0 if all(map(passed, report["runtimes"])) else 1


if __name__ == "__main__":
    raise SystemExit(main())
