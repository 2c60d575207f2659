"""Imports follow the data flow: protocol/ is what every side shares and imports no side; the server and the
perf model import protocol/ and themselves, never the client's side (client/, interpose/). Read from the
sources' import statements, those inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "client", "interpose", "server", "perfmodel")
MAY_IMPORT = {
    "protocol": {"protocol"},
    "server": {"protocol", "server"},
    "perfmodel": {"protocol", "perfmodel"},
}
def imported_packages(path: Path, root: Path = ROOT) -> set[str]:
    """The top-level folders of xpuremote that the module at `path` imports, relative imports resolved."""
    package = path.relative_to(root).parent.parts  # ("server", "backends")
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            names = [".".join(("xpuremote", *base, *([node.module] if node.module else [])))]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        out |= {n.split(".")[1] for n in names if n.startswith("xpuremote.") and n.split(".")[1] in PACKAGES}
    return out


def test_the_server_protocol_and_perf_model_import_nothing_of_the_client_side(tmp_path: Path) -> None:
    planted = tmp_path / "server" / "backends" / "m.py"  # the reader sees imports at any depth, relative too
    planted.parent.mkdir(parents=True)
    planted.write_text("from . import sim\n\n\ndef f():\n    from ...client import auth\n"
                       "    import xpuremote.interpose.run\n")
    assert imported_packages(planted, tmp_path) == {"server", "client", "interpose"}
    wrong = sorted((str(p.relative_to(ROOT)), pkg) for side, allowed in MAY_IMPORT.items()
                   for p in (ROOT / side).rglob("*.py") for pkg in imported_packages(p) - allowed)
    assert wrong == []
