"""Occupancy questions (tests/programs/occupancy_check.py through the shim): the client answers a question
asked before from the first answer, until a setting that could change it is made; a function gone is
refused, not answered from memory."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, shim_env, start_server

PROGRAM = ROOT / "tests" / "programs" / "occupancy_check.py"
PTX = ROOT / "tests" / "programs" / "saxpy.ptx"


def test_occupancy_is_asked_once_per_question(shim: Path, tmp_path: Path) -> None:
    """Five questions and two block-size searches cost the server what one of each does (a search asks once
    per block size: 33 round trips); an attribute set makes the next question go to the server again."""
    server = start_server(tmp_path)
    variants = ("1 1 0", "5 2 0", "1 1 1")
    try:
        runs = [subprocess.run([sys.executable, str(PROGRAM), str(PTX), *v.split()], capture_output=True, text=True,
                               timeout=60, env=shim_env(shim, server.address)) for v in variants]
    finally:
        server.stop()
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        per_sm, grid, block, after_unload = map(int, run.stdout.split())
        assert per_sm > 0 and grid > 0 and block > 0 and after_unload == 400, run.stdout  # INVALID_HANDLE
    served = [int(n) for n in re.findall(r"session \S+ ended: (\d+) calls", server.log())]
    assert len(served) == 3 and served[0] == served[1] and served[2] == served[0] + 2, served
