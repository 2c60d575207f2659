"""AES-256-GCM in C for the data connection's small records (protocol/gcm.c, protocol/stream.py).

A synchronous call's round trip seals and opens four small records, each right after its process has waited
for the other end. cryptography's AESGCM (OpenSSL) costs 0.6 µs there warm but 2-3.5 µs cold, through its
bindings and OpenSSL's EVP and provider layers; gcm.c is a few hundred bytes of AES-NI and PCLMULQDQ code
called through cffi's compiled interface, and writes the same records byte for byte. Large records stay with
OpenSSL, whose wide, interleaved code is several times faster in bulk.

Built once per cache (protocol/cbuild.py) with this Python's compiler; where it cannot be built or loaded, or
the CPU lacks AES-NI or PCLMULQDQ, `library()` is None (said once) and every record goes through cryptography;
so too with XPU_SEAL_NATIVE=0 (to compare the two: bench/sealing.py, bench/foundation.py).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

from .cbuild import cffi_module

log = logging.getLogger("xpuremote.stream")

SOURCE = Path(__file__).with_name("gcm.c")
MODULE = "_xpuremote_gcm"
CDEF = """
struct xpu_gcm;
int xpu_gcm_usable(void);
struct xpu_gcm *xpu_gcm_new(const uint8_t *key);
void xpu_gcm_free(struct xpu_gcm *g);
void xpu_gcm_seal(const struct xpu_gcm *g, uint64_t count, const uint8_t *in, size_t n, uint8_t *out);
int xpu_gcm_open(const struct xpu_gcm *g, uint64_t count, uint8_t *record, size_t n, uint8_t *out);
int64_t xpu_gcm_open_first(const struct xpu_gcm *g, uint64_t count, uint8_t *raw, size_t got, size_t most,
                           uint8_t *out);
"""
@functools.cache
def library() -> tuple[Any, Any] | None:
    """(ffi, lib), built on first use; None where it cannot be."""
    if os.environ.get("XPU_SEAL_NATIVE", "1") == "0":
        return None
    try:
        module = cffi_module(MODULE, SOURCE, CDEF)
    except Exception as exc:  # a missing compiler, headers or setuptools: the records go through cryptography
        log.warning("the data connection's small records are sealed through cryptography: gcm.c did not "
                    "build or load (%s)", exc)
        return None
    if not module.lib.xpu_gcm_usable():
        log.info("this CPU has no AES-NI or PCLMULQDQ: the data connection's records are all sealed through "
                 "cryptography")
        return None
    return module.ffi, module.lib
