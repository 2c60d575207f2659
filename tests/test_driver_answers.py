"""bench/driver_answers.py: the probe under the shim against the sim, and the comparison of two records."""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType
from typing import Any

import pytest
from conftest import BACKEND, DEVICE_NAME, ROOT, Server

from xpuremote.protocol import errors
from xpuremote.server.backends.sim import SIM_DRIVER_VERSION

LOGGED_UUID = "0123abcd-0000-1111-2222-333344445555"
LOG = (f"xpuremote: WARNING a library asked for private table {LOGGED_UUID}, which xpuremote does not implement\n"
       "xpuremote: WARNING the runtime called slot 9 of private table cudart, which xpuremote does not implement\n")


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("driver_answers", ROOT / "bench" / "driver_answers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


da = load_bench()


@pytest.fixture(scope="module")
def record(server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("answers")
    (tmp / "torch.log").write_text(LOG)
    out = tmp / "answers.json"
    assert da.main(["--out", str(out), "--server", server.address, "--tables-log", str(tmp / "torch.log")]) == 0
    result = json.loads(out.read_text())
    result["markdown"] = out.with_suffix(".md").read_text()
    return result


def test_the_shim_side_answers_everything_asked(record: dict[str, Any]) -> None:
    shim = record["sides"]["shim"]
    assert shim["present"] and shim["is_shim"] and not shim["missing"]
    answers = shim["answers"]
    version = answers["driver"]["cuDriverGetVersion"]
    assert version["status"] == 0 and (version["value"] == SIM_DRIVER_VERSION if BACKEND == "sim" else
                                       version["value"] >= 12000)
    assert answers["driver"]["cuDeviceGetCount"]["status"] == 0 and answers["driver"]["cuDeviceGetCount"]["value"] >= 1
    assert answers["device"]["dev0 name"]["value"].startswith(DEVICE_NAME)
    attributes = {int(key.split()[1]) for key in answers["attribute"]}
    assert attributes == set(da.attribute_ids())
    # refused only where the real driver refuses it too (a driver older than the headers: 148-161 on 580)
    real = record["sides"].get("real", {}).get("answers", {}).get("attribute", {})
    refused = {key: a["status"] for key, a in answers["attribute"].items() if a["status"] != 0}
    assert refused == {key: real[key]["status"] for key in refused if key in real}, refused
    names = answers["cuGetErrorName"]
    assert len(names) == len(errors.NAMES) == len(answers["cuGetErrorString"])
    assert names[f"{errors.INVALID_VALUE} CUDA_ERROR_INVALID_VALUE"] == {"status": 0,
                                                                        "value": "CUDA_ERROR_INVALID_VALUE"}
    edges = answers["edge"]
    assert edges["cuDeviceGet(-1)"]["status"] == errors.INVALID_DEVICE
    assert edges["cuCtxGetCurrent before any context"] == {"status": 0, "value": "NULL"}


def test_the_private_tables(record: dict[str, Any]) -> None:
    tables = record["sides"]["shim"]["answers"]["cuGetExportTable"]
    assert set(tables) == set(record["tables"]) == {*da.shim_tables(), *da.EXTRA_TABLES, LOGGED_UUID}
    assert len(da.shim_tables()) == 7
    for uuid in da.shim_tables():
        assert tables[uuid]["status"] == 0
        assert (tables[uuid]["value"]["size"] is None) == (uuid in da.NO_SIZE_SLOT)
    assert tables["6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"]["value"] == {"size": 13 * 8, "filled": "1" * 12}
    assert tables["21318c60-9714-3248-8ca6-41ff7324c8f2"]["value"] == {"size": 95 * 8, "filled": "1" * 94}
    for uuid in (*da.EXTRA_TABLES, LOGGED_UUID):
        assert tables[uuid] == {"status": errors.INVALID_VALUE, "value": None}
    assert list(record["from_logs"]["tables"]) == [LOGGED_UUID]
    assert list(record["from_logs"]["slots"]) == ["cudart[9]"]


@pytest.mark.parametrize("fn", ["cuKernelGetName", "cuFuncGetName"])
def test_null_name_or_handle_is_invalid_value(record: dict[str, Any], fn: str) -> None:
    """The driver API documents CUDA_ERROR_INVALID_VALUE for either NULL (the shim said 400, INVALID_HANDLE)."""
    edges = record["sides"]["shim"]["answers"]["edge"]
    assert edges[f"{fn}(&name, NULL)"] == {"status": errors.INVALID_VALUE, "value": None}
    assert edges[f"{fn}(NULL, NULL)"]["status"] == errors.INVALID_VALUE


def test_a_null_output_pointer_is_invalid_value(record: dict[str, Any]) -> None:
    """A local answer with nowhere to go is the driver's INVALID_VALUE (the shim said success)."""
    assert record["sides"]["shim"]["answers"]["edge"]["cuDeviceGetCount(NULL)"]["status"] == errors.INVALID_VALUE


def test_without_a_driver_the_record_says_so(record: dict[str, Any]) -> None:
    if record["sides"]["real"]["present"]:
        pytest.skip("this machine has a CUDA driver")
    assert record["sides"]["real"]["reason"]
    assert record["differences"] == [] and record["summary"] == {"real": "absent"}
    assert "the record holds the shim's answers only" in record["markdown"]


def test_compare_lists_what_differs() -> None:
    def probe(sm_count: int, text: str, table: dict[str, Any] | None) -> dict[str, Any]:
        answers = {"attribute": {"dev0 16 MULTIPROCESSOR_COUNT": {"status": 0, "value": sm_count},
                                 "dev0 83 MANAGED_MEMORY": {"status": 0, "value": 0}},
                   "cuGetErrorString": {"1 CUDA_ERROR_INVALID_VALUE": {"status": 0, "value": text}},
                   "cuGetExportTable": {} if table is None else {"21318c60-9714-3248-8ca6-41ff7324c8f2": table}}
        return {"present": True, "answers": answers}

    real = probe(132, "invalid argument", {"status": 0, "value": {"size": 48, "filled": "11111"}})
    assert da.compare(real, real) == []
    assert da.compare(None, real) == [] and da.compare({"present": False}, real) == []
    shim = probe(16, "This indicates that ...", None)
    shim["answers"]["attribute"]["dev0 83 MANAGED_MEMORY"]["value"] = 1
    diffs = da.compare(real, shim, da.notes())
    assert [(d["section"], d["key"]) for d in diffs] == [
        ("attribute", "dev0 16 MULTIPROCESSOR_COUNT"), ("attribute", "dev0 83 MANAGED_MEMORY"),
        ("cuGetErrorString", "1 CUDA_ERROR_INVALID_VALUE"),
        ("cuGetExportTable", "21318c60-9714-3248-8ca6-41ff7324c8f2")]
    assert diffs[0]["real"]["value"] == 132 and diffs[0]["shim"]["value"] == 16 and "note" not in diffs[0]
    assert diffs[1]["note"].startswith("by design") and diffs[2]["note"]
    assert diffs[3]["shim"] is None
    assert da.summary(diffs) == {"differences": 4, "explained": 2,
                                 "by_section": {"attribute": 2, "cuGetErrorString": 1, "cuGetExportTable": 1}}


def test_error_strings_are_written_from_a_real_drivers_record(tmp_path) -> None:
    """The file the shim's cuGetErrorString answers from (protocol/driver_error_strings.json)."""
    real = {"present": True, "library": "/some/dir/libcuda.so.580.1",
            "answers": {"driver": {"cuDriverGetVersion": {"status": 0, "value": 13000}},
                        "cuGetErrorString": {"0 CUDA_SUCCESS": {"status": 0, "value": "no error"},
                                             "1 CUDA_ERROR_INVALID_VALUE": {"status": 0, "value": "invalid argument"},
                                             "999 CUDA_ERROR_UNKNOWN": {"status": 1, "value": None}}}}
    record = tmp_path / "gpu-check.json"  # the GPU check's report holds the record as stage 5's answers
    record.write_text(json.dumps({"stages": {"5": {"answers": {"when": "then", "sides": {"real": real}}}}}))
    out = tmp_path / "strings.json"
    assert da.main(["--error-strings", str(record), str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["strings"] == {"CUDA_SUCCESS": "no error", "CUDA_ERROR_INVALID_VALUE": "invalid argument"}
    assert written["recorded"].startswith("cuGetErrorString of libcuda.so.580.1 (CUDA 13.0), then")
    record.write_text(json.dumps({"when": "then", "sides": {"real": {"present": False}}}))
    assert da.main(["--error-strings", str(record), str(out)]) == 1  # no real driver: nothing to write


def test_the_shims_error_strings_are_the_recorded_drivers() -> None:
    recorded = json.loads((ROOT / "protocol" / "driver_error_strings.json").read_text())["strings"]
    assert errors.message(errors.INVALID_VALUE) == recorded["CUDA_ERROR_INVALID_VALUE"] == "invalid argument"
    assert set(recorded) <= set(errors.CODES)
