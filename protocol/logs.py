"""XPU_LOG, read alike by the shim and the server: a level name, or CALLS for every call as well."""

from __future__ import annotations

import logging
import os
import sys

EVERY_CALL = 5  # below DEBUG: the shim names every call the application makes, with its arguments
logging.addLevelName(EVERY_CALL, "CALLS")
LEVELS = ("CALLS", "DEBUG", "INFO", "WARNING", "ERROR")


def level(default: str) -> int:
    """XPU_LOG's level; a name that is none of LEVELS is said once and `default` used."""
    name = os.environ.get("XPU_LOG", default).upper()
    if name not in LEVELS:
        sys.stderr.write(f"xpuremote: XPU_LOG={name} is not one of {', '.join(LEVELS)}; using {default}\n")
        name = default
    return logging.getLevelName(name)
