"""NVIDIA's own cuda-python driver tests (cuda_bindings/tests) through xpuremote, against a sim server.

    python bench/cuda_python_tests.py [--tests test_cuda.py,test_cudart.py] [--server tcp://host:port]
                                      [--source DIR] [--timeout 900] [--out bench/results/cuda-python-tests.md]

Gets the test files of the installed cuda-bindings release at run time (they are NVIDIA's and are
never committed here) into ~/.cache/xpuremote/cuda-python-tests/VERSION/src, keeping the source
tree's layout (cuda_bindings/tests beside cuda_python_test_helpers, which the tests' conftest.py
puts on sys.path). In order: that cache; --source DIR (a cuda-python checkout or unpacked source
archive of the matching release); the sdist on the package index (`pip download --no-binary`);
GitHub's source archive of the release tag. Each step that fails says why; when all fail, nothing
is run. Then it starts an `xpu-server --backend sim` of its own (unless --server), runs pytest on the
chosen files under `xpu-run`, and prints the counts and every failure and error with its first
line and the driver functions the client said it does not forward. --out writes the same as
Markdown; a section of that file from the heading "## Analysis" on (written by hand) is kept.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache" / "xpuremote" / "cuda-python-tests"
# What the tests need of the source tree: the tests and the shared helpers their conftest.py imports.
TREES = ("cuda_bindings/tests", "cuda_python_test_helpers")
ARCHIVE = "https://codeload.github.com/NVIDIA/cuda-python/tar.gz/refs/tags/{tag}"
TAGS = ("v{version}", "cuda-bindings-v{version}")  # the repository has used both for bindings releases
UNSUPPORTED = re.compile(r"(\w+) is not supported by xpuremote yet")
NO_KERNEL = "no host implementation of kernel"
ANALYSIS = "## Analysis"


@dataclass
class Case:
    name: str  # file::test
    outcome: str  # passed, failed, error, skipped
    message: str = ""  # first meaningful line
    unsupported: list[str] = field(default_factory=list)  # driver functions the client said it does not forward
    last_call: str = ""  # the last cuXxx( call of the test's source before the line that failed


# ---- getting the tests


def unpack(tar: tarfile.TarFile, dest: Path) -> bool:
    """Extracts TREES from a source tarball whose members sit under one top folder; True if the tests were there."""
    wanted = [m for m in tar.getmembers()
              if "/" in m.name and m.name.split("/", 1)[1].startswith(TREES) and (m.isfile() or m.isdir())]
    if not any(m.name.split("/", 1)[1].startswith(TREES[0] + "/") for m in wanted):
        return False
    for member in wanted:
        member.name = member.name.split("/", 1)[1]
    tar.extractall(dest, members=wanted, filter="data")
    return True


def from_sdist(version: str, dest: Path) -> str:
    """Why the sdist gave no tests, or "" when it did."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                               "-d", tmp, f"cuda-bindings=={version}"], capture_output=True, text=True, timeout=600)
        sdists = list(Path(tmp).glob("*.tar.gz"))
        if proc.returncode or not sdists:
            return f"no sdist of cuda-bindings {version} on the package index (NVIDIA publishes wheels only)"
        with tarfile.open(sdists[0]) as tar:
            return "" if unpack(tar, dest) else f"the sdist {sdists[0].name} has no tests folder"


def from_github(version: str, dest: Path) -> tuple[str, str]:
    """(the archive's URL, "") when a tag's source archive gave the tests, else ("", why not)."""
    whys = []
    for tag in (t.format(version=version) for t in TAGS):
        url = ARCHIVE.format(tag=tag)
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                data = response.read()
        except OSError as exc:  # URLError, HTTPError, timeouts: all say why
            whys.append(f"{url}: {exc}")
            continue
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            if unpack(tar, dest):
                return url, ""
            whys.append(f"{url}: no {TREES[0]} in the archive")
    return "", "; ".join(whys)


def from_source(source: Path, dest: Path) -> None:
    for tree in TREES:
        if not (source / tree).is_dir():
            raise SystemExit(f"--source {source}: no {tree} there (give the root of a cuda-python source tree)")
        shutil.copytree(source / tree, dest / tree, dirs_exist_ok=True)


def get_tests(version: str, source: Path | None) -> tuple[Path, str]:
    """(the tests folder, where it came from), fetching it into the cache when it is not there yet."""
    cache = CACHE / version
    dest, note = cache / "src", cache / "SOURCE"
    if (dest / TREES[0]).is_dir() and not source:
        return dest / TREES[0], note.read_text().strip() if note.exists() else f"cached in {dest}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    if source:
        from_source(source, dest)
        origin = f"copied from {source}"
    elif not (why_sdist := from_sdist(version, dest)):
        origin = f"sdist of cuda-bindings {version}"
    else:
        print(f"cuda-python-tests: {why_sdist}; trying GitHub's source archive", file=sys.stderr)
        url, why_github = from_github(version, dest)
        if not url:
            shutil.rmtree(cache, ignore_errors=True)
            raise SystemExit(f"cuda-python-tests: could not get the tests of cuda-bindings {version}:\n"
                             f"  - {why_sdist}\n  - {why_github}\n"
                             f"Get the release's source tree elsewhere and pass it with --source DIR.")
        origin = url
    note.write_text(origin + "\n")
    return dest / TREES[0], origin


def helper_paths(version: str) -> list[str]:
    """Extra PYTHONPATH for the test helpers, whose __init__ imports cuda.core (NVIDIA's CI installs it)."""
    if importlib.util.find_spec("cuda.core") is not None:
        return []
    deps = CACHE / version / "deps"
    if not (deps / "cuda" / "core").is_dir():  # beside the venv, not into it: a test-only dependency
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(deps),
                        "cuda-core"], check=True, timeout=600)
    return [str(deps)]


# ---- running them


def start_server(log_path: Path) -> tuple[subprocess.Popen, str]:
    """A sim xpu-server on a free loopback port; returns once its log says it is ready."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "xpuremote.server.daemon", "--listen", address,
                                 "--backend", "sim"], stderr=log, env={**env, "XPU_LOG": "INFO"})
    deadline = time.monotonic() + 30
    while "ready" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"xpu-server did not start:\n{log_path.read_text()}")
        time.sleep(0.1)
    return proc, address


def pytest_command(server: str, tests: list[str], junit: Path) -> list[str]:
    # junit_logging=all puts each test's captured stderr into the XML: the client's "not supported" lines
    return [sys.executable, "-m", "xpuremote.interpose.run", "--server", server, "--",
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-o", "junit_logging=all",
            "-o", "faulthandler_timeout=120", f"--junitxml={junit}", *tests]


def run_pytest(cmd: list[str], cwd: Path, paths: list[str], log: Path, timeout: float) -> str:
    """Runs `cmd` with stdout and stderr into `log`; returns "" or why it did not finish."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")]))}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the session holds xpu-run and pytest under it
            proc.wait()
            return f"killed after {timeout:.0f} s"
    return "" if proc.returncode in (0, 1) else f"pytest exited {proc.returncode}"


# ---- reading the results


def first_line(text: str) -> str:
    """The first line of a failure that says something: an `E ` line of the traceback, else the message."""
    for line in text.splitlines():
        if line.startswith("E ") and line[1:].strip():
            return line[1:].strip()
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def last_call(text: str) -> str:
    """The driver or runtime call a failed assert most likely checks: the last `cuXxx(` or `cudaXxx(` before
    the line marked `>`.

    The client names a function it does not forward once a process, so a second test that calls it is
    only linked to it this way."""
    before = text.split("\n>", 1)[0] + "\n" + text.split("\n>", 1)[-1].split("\n", 1)[0]
    calls = re.findall(r"\b(cu(?:da)?[A-Z]\w*)\(", before)
    return calls[-1] if calls else ""


def parse_junit(path: Path) -> list[Case]:
    cases = []
    for tc in ET.parse(path).iter("testcase"):
        name = f"{tc.get('classname', '').replace('.', '/')}.py::{tc.get('name')}"  # nvml.test_x: nvml/test_x.py
        said = " ".join(e.text or "" for e in tc.iter() if e.tag in ("system-err", "system-out"))
        unsupported = list(dict.fromkeys(UNSUPPORTED.findall(said)))
        case = Case(name, "passed", unsupported=unsupported)
        for tag in ("failure", "error", "skipped"):
            if (e := tc.find(tag)) is not None:
                case.outcome = {"failure": "failed"}.get(tag, tag)
                text = (e.text or "") if tag != "skipped" else ""
                case.message = first_line(text) or first_line(e.get("message") or "")
                case.last_call = last_call(text)
        cases.append(case)
    return cases


def parse_verbose(log: Path) -> list[Case]:
    """When pytest never wrote its XML (killed, crashed): the outcomes its -v lines gave."""
    found = re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", log.read_text(errors="replace"), re.M)
    words = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped"}
    return [Case(name, words[word]) for name, word in found]


def counts(cases: list[Case]) -> dict[str, int]:
    return {k: sum(c.outcome == k for c in cases) for k in ("passed", "failed", "error", "skipped")}


def group(case: Case, unsupported: set[str], server_log: str) -> str:
    """A first guess at why a test failed; the Analysis section says it properly."""
    if NO_KERNEL in case.message or (NO_KERNEL in server_log and "kernel" in case.message):
        return "kernel the sim cannot run"
    # cuArrayCreate in the source is cuArrayCreate_v2 in the client's words
    named = [s for s in sorted(unsupported) if case.last_call and s.split("_v")[0] == case.last_call]
    if case.unsupported or named:
        return "not forwarded: " + ", ".join(dict.fromkeys(case.unsupported + named))
    return "other"


# ---- reporting


def report(meta: dict[str, str], cases: list[Case], why: str, server_log: str, output: str) -> str:
    n = counts(cases)
    lines = ["# NVIDIA's cuda-python tests through xpuremote", "",
             *(f"- {k}: {v}" for k, v in meta.items()), "",
             f"**{n['passed']} passed, {n['failed']} failed, {n['error']} errors, {n['skipped']} skipped**"
             f" of {len(cases)}.", ""]
    if why:
        lines += [f"The run did not finish: {why}. Outcomes below are what pytest printed before.", "",
                  "```", "\n".join(output.splitlines()[-40:]), "```", ""]
    bad = [c for c in cases if c.outcome in ("failed", "error")]
    everywhere = sorted({s for c in cases for s in c.unsupported} | set(UNSUPPORTED.findall(output)))
    if bad:
        lines += ["## Failures and errors", "",
                  "| test | outcome | first line | last driver call | client said not forwarded |",
                  "|---|---|---|---|---|"]
        lines += [f"| `{c.name}` | {c.outcome} | {c.message.replace('|', '¦')[:300]} | {c.last_call} | "
                  f"{', '.join(c.unsupported)} |" for c in bad]
        groups: dict[str, list[str]] = {}
        for c in bad:
            groups.setdefault(group(c, set(everywhere), server_log), []).append(c.name.split("::", 1)[1])
        lines += ["", "## Grouped by the script (a first guess)", ""]
        lines += [f"- {g} ({len(names)}): {', '.join(names)}" for g, names in sorted(groups.items())]
    skipped = [c for c in cases if c.outcome == "skipped"]
    if skipped:
        lines += ["", "## Skipped", "", *(f"- `{c.name}`: {c.message}" for c in skipped)]
    if everywhere:
        lines += ["", "Driver functions the client said it does not forward, over the whole run: "
                  + ", ".join(f"`{s}`" for s in everywhere)]
    return "\n".join(lines) + "\n"


def kept_analysis(out: Path) -> str:
    """The hand-written part of an earlier report, from its "## Analysis" heading on."""
    text = out.read_text() if out.exists() else ""
    return text[text.index(ANALYSIS):] if ANALYSIS in text else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default="test_cuda.py", help="test files of cuda_bindings/tests, comma-separated")
    parser.add_argument("--server", help="an xpu-server to use instead of starting a sim one")
    parser.add_argument("--source", type=Path, help="root of a cuda-python source tree of the installed release")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for the whole pytest run")
    parser.add_argument("--out", type=Path, help="write the report here as Markdown")
    args = parser.parse_args(argv)

    version = importlib.metadata.version("cuda-bindings")
    tests_dir, origin = get_tests(version, args.source)
    paths = helper_paths(version)
    from xpuremote.interpose.build import ensure_shim

    ensure_shim()  # built before the clock of the run starts
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        server_log, junit, log = tmpdir / "server.log", tmpdir / "junit.xml", tmpdir / "pytest.log"
        server, address = (None, args.server) if args.server else start_server(server_log)
        cmd = pytest_command(address, args.tests.split(","), junit)
        start = time.monotonic()
        try:
            why = run_pytest(cmd, tests_dir, paths, log, args.timeout)
        finally:
            if server is not None:
                server.terminate()
                server.wait(10)
        cases = parse_junit(junit) if junit.exists() else parse_verbose(log)
        output = log.read_text(errors="replace")
        sim_log = server_log.read_text(errors="replace") if server_log.exists() else ""
    meta = {"command": " ".join(["python bench/cuda_python_tests.py", *(argv or sys.argv[1:])]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "cuda-bindings": f"{version} (tests: {origin})",
            "server": args.server or "sim backend, started by the script",
            "pytest, run in cuda_bindings/tests": " ".join(["xpu-run --server ADDRESS -- python",
                                                            *cmd[cmd.index("--") + 2:]])
            .replace(str(junit), "junit.xml"),
            "wall time": f"{time.monotonic() - start:.0f} s"}
    text = report(meta, cases, why, sim_log, output)
    print(text)
    if args.out:
        kept = kept_analysis(args.out)
        args.out.write_text(text + ("\n" + kept if kept else ""))
    return 0 if cases and not why else 1


if __name__ == "__main__":
    raise SystemExit(main())
