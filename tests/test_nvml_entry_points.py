"""The NVML forwarder's entry points are generated from protocol/nvml.py and committed: the committed
interpose/nvml_entry_points.c is what the table gives, and a changed row changes it. (The NVML calls themselves
are run through the built library by tests/test_nvml.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from xpuremote.protocol import generate_nvml, nvml

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "interpose" / "nvml_entry_points.c"


def test_the_committed_entry_points_are_what_the_table_gives() -> None:
    assert COMMITTED.read_text() == generate_nvml.entry_points(nvml.TABLE, nvml.RETURNS)
    assert generate_nvml.outputs(ROOT) == {COMMITTED: COMMITTED.read_text()}


def test_a_changed_row_changes_the_entry_points() -> None:
    table = list(nvml.TABLE)
    index = next(i for i, f in enumerate(table) if f.name == "nvmlDeviceGetIndex")
    table[index] = dataclasses.replace(table[index], params=(*table[index].params, "int"))
    changed = generate_nvml.entry_points(table, nvml.RETURNS)
    assert "nvmlDeviceGetIndex(void * a0, unsigned int * a1, int a2)" in changed
    assert f"uint64_t s[3] = {{(uint64_t)(uintptr_t)a0, (uint64_t)(uintptr_t)a1, (uint64_t)a2}};\n" \
           f"    return xpu_forward({table[index].op}, s);" in changed
    assert changed != COMMITTED.read_text()
