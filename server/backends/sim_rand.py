"""cuRAND's host API on the sim device: pseudorandom generators computed with numpy over the sim's memory.

The numbers are not cuRAND's. cuRAND's host API spreads a sequence over its GPU threads in an order its guide does
not pin down for every generator (XORWOW, the default, skips 2^67 ahead per thread), so no host copy can match it
bit for bit. What the sim gives instead, for every pseudorandom type: Philox4x32-10 (the rounds and key schedule of
curand_philox4x32_x.h, key = the seed) read in counter order, the n-th 32-bit value of a generator's sequence being
word n % 4 of block n / 4; the generator type picks the counter's third word, so two types give two sequences. The
values are turned into each distribution the way the device API's headers do (curand_uniform.h, curand_normal.h:
uniform in (0, 1], Box-Muller pairs). So a seed and an offset give the same numbers every time, a new seed others,
with the right distribution, type and count. The offset is absolute and counts 32-bit values: a float, an unsigned
int and a Poisson or binomial value take one, a double two, a normal double's pair four. The ordering is kept and
checked, but the sim has one order. Quasirandom (Sobol) generators need cuRAND's direction vectors, which only its
library holds: the sim refuses them (a GPU server runs them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from xpuremote.protocol import errors, mathlibs

ENUMS = mathlibs.api(mathlibs.CURAND).ENUMS
PSEUDO_DEFAULT, XORWOW = ENUMS["CURAND_RNG_PSEUDO_DEFAULT"], ENUMS["CURAND_RNG_PSEUDO_XORWOW"]
PSEUDO = {ENUMS[f"CURAND_RNG_PSEUDO_{t}"] for t in ("XORWOW", "MRG32K3A", "MTGP32", "MT19937", "PHILOX4_32_10")}
QUASI = {ENUMS[f"CURAND_RNG_QUASI_{t}"] for t in ("DEFAULT", "SOBOL32", "SCRAMBLED_SOBOL32", "SOBOL64",
                                                  "SCRAMBLED_SOBOL64")}
PSEUDO_ORDERINGS = {ENUMS[f"CURAND_ORDERING_PSEUDO_{o}"] for o in ("BEST", "DEFAULT", "SEEDED", "LEGACY", "DYNAMIC")}
POISSON_MAX = 400_000  # cuRAND's own bound on lambda
CHUNK = 1 << 20  # outputs computed at once (bounds the temporaries of a large request)

# Philox4x32-10's constants (curand_philox4x32_x.h)
M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK = np.uint64(0xFFFFFFFF)
INV32 = np.float32(2.3283064e-10)  # CURAND_2POW32_INV
INV32_2PI = np.float32(np.float32(2.3283064e-10) * np.float32(6.2831855))  # CURAND_2POW32_INV_2PI
INV53 = 1.1102230246251565e-16  # CURAND_2POW53_INV_DOUBLE


def refuse(outcome: str, message: str) -> errors.CudaError:
    return errors.library_error("curand", outcome, message)


def philox(counters: list[np.ndarray], seed: int) -> list[np.ndarray]:
    """Philox4x32-10 of each counter (four arrays of 32-bit words in uint64), keyed by the 64-bit seed."""
    x, y, z, w = (c.astype(np.uint64) for c in counters)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0, p1 = np.uint64(M0) * x, np.uint64(M1) * z
        x, y, z, w = (p1 >> np.uint64(32)) ^ y ^ k0, p1 & MASK, (p0 >> np.uint64(32)) ^ w ^ k1, p0 & MASK
        k0, k1 = (k0 + np.uint64(W0)) & MASK, (k1 + np.uint64(W1)) & MASK
    return [x, y, z, w]


@dataclass
class Generator:
    rng_type: int
    seed: int = 0
    offset: int = 0  # 32-bit values of the sequence used so far (absolute: curandSetGeneratorOffset sets it)
    ordering: int = ENUMS["CURAND_ORDERING_PSEUDO_DEFAULT"]
    stream: Any = None

    def bits(self, count: int) -> np.ndarray:
        """The next `count` 32-bit values of the sequence (uint64 holding uint32), the offset moved past them."""
        first, end = self.offset // 4, (self.offset + count + 3) // 4
        blocks = np.arange(first, end, dtype=np.uint64)
        zeros = np.zeros_like(blocks)
        words = philox([blocks & MASK, blocks >> np.uint64(32), zeros + np.uint64(self.rng_type), zeros], self.seed)
        start = self.offset % 4
        self.offset += count
        return np.stack(words, axis=1).reshape(-1)[start:start + count]


class SimRand:
    """The cuRAND families the call table forwards, over the sim's `memory`."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory

    # ---- generators ------------------------------------------------------------------------------
    def curandCreateGenerator(self, rng_type: int) -> tuple[Generator]:
        if rng_type in QUASI:
            raise refuse("not_supported", "quasirandom (Sobol) generators need cuRAND's direction vectors: the sim "
                         "runs the pseudorandom ones only (a GPU server runs these)")
        if rng_type != PSEUDO_DEFAULT and rng_type not in PSEUDO:
            raise refuse("type_error", f"{rng_type} is not a cuRAND generator type")
        return (Generator(XORWOW if rng_type == PSEUDO_DEFAULT else rng_type),)

    def curandDestroyGenerator(self, gen: Generator) -> None:
        pass

    def curandSetStream(self, gen: Generator, stream: Any) -> None:
        gen.stream = stream

    def curandSetPseudoRandomGeneratorSeed(self, gen: Generator, seed: int) -> None:
        gen.seed = seed & 0xFFFFFFFFFFFFFFFF

    def curandSetGeneratorOffset(self, gen: Generator, offset: int) -> None:
        gen.offset = offset & 0xFFFFFFFFFFFFFFFF

    def curandSetGeneratorOrdering(self, gen: Generator, order: int) -> None:
        if order not in PSEUDO_ORDERINGS:
            raise refuse("invalid_value", f"ordering {order} is not one of a pseudorandom generator")
        gen.ordering = order

    def curandSetQuasiRandomGeneratorDimensions(self, gen: Generator, dimensions: int) -> None:
        raise refuse("type_error", "dimensions are a quasirandom generator's setting")

    def curandGenerateSeeds(self, gen: Generator) -> None:
        pass  # a counter-based sequence has no starting states to make

    # ---- generations -----------------------------------------------------------------------------
    def _fill(self, gen: Generator, ptr: int, count: int, dtype: str, per_output: int,
              convert: Callable[[np.ndarray], np.ndarray]) -> None:
        """`count` outputs of `dtype` at `ptr`, each from `per_output` values of the sequence, chunk by chunk."""
        if count < 0:
            raise refuse("invalid_value", f"{count} values")
        if not count:
            return
        out = np.frombuffer(self.memory.view(ptr, count * np.dtype(dtype).itemsize), dtype)
        for start in range(0, count, CHUNK):
            n = min(CHUNK, count - start)
            out[start:start + n] = convert(gen.bits(n * per_output))

    def curandGenerate(self, gen: Generator, ptr: int, num: int) -> None:
        self._fill(gen, ptr, num, "<u4", 1, lambda bits: bits)

    def curandGenerateLongLong(self, gen: Generator, ptr: int, num: int) -> None:
        raise refuse("type_error", "curandGenerateLongLong needs a 64-bit quasirandom generator")

    def curandGenerateUniform(self, gen: Generator, ptr: int, num: int) -> None:
        self._fill(gen, ptr, num, "<f4", 1, uniform)

    def curandGenerateUniformDouble(self, gen: Generator, ptr: int, num: int) -> None:
        self._fill(gen, ptr, num, "<f8", 2, lambda bits: uniform_double(bits[0::2], bits[1::2]))

    def curandGenerateNormal(self, gen: Generator, ptr: int, n: int, mean: float, stddev: float) -> None:
        _even(n)
        self._fill(gen, ptr, n, "<f4", 1, lambda bits: np.float32(mean) + np.float32(stddev) * box_muller(bits))

    def curandGenerateNormalDouble(self, gen: Generator, ptr: int, n: int, mean: float, stddev: float) -> None:
        _even(n)
        self._fill(gen, ptr, n, "<f8", 2, lambda bits: mean + stddev * box_muller_double(bits))

    def curandGenerateLogNormal(self, gen: Generator, ptr: int, n: int, mean: float, stddev: float) -> None:
        _even(n)
        self._fill(gen, ptr, n, "<f4", 1,
                   lambda bits: np.exp(np.float32(mean) + np.float32(stddev) * box_muller(bits)))

    def curandGenerateLogNormalDouble(self, gen: Generator, ptr: int, n: int, mean: float, stddev: float) -> None:
        _even(n)
        self._fill(gen, ptr, n, "<f8", 2, lambda bits: np.exp(mean + stddev * box_muller_double(bits)))

    def curandGeneratePoisson(self, gen: Generator, ptr: int, n: int, lam: float) -> None:
        if not 0 < lam <= POISSON_MAX:
            raise refuse("invalid_value", f"lambda {lam} is not in (0, {POISSON_MAX}]")
        ks, cdf = poisson_cdf(lam)
        self._fill(gen, ptr, n, "<u4", 1, lambda bits: invert(ks, cdf, bits))

    def curandGenerateBinomial(self, gen: Generator, ptr: int, num: int, n: int, p: float) -> None:
        if not 0 <= p <= 1:
            raise refuse("invalid_value", f"probability {p} is not in [0, 1]")
        ks, cdf = binomial_cdf(n, p)
        self._fill(gen, ptr, num, "<u4", 1, lambda bits: invert(ks, cdf, bits))


# ---- the distributions: the device API's conversions -------------------------------------------------
def uniform(bits: np.ndarray) -> np.ndarray:
    """_curand_uniform: x * 2^-32 + 2^-33 in single precision, in (0, 1]."""
    return bits.astype(np.float32) * INV32 + np.float32(INV32 / np.float32(2))


def uniform_double(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """_curand_uniform_double_hq: 53 bits of two values, in (0, 1)."""
    z = x ^ (y << np.uint64(21))
    return z.astype(np.float64) * INV53 + INV53 / 2


def box_muller(bits: np.ndarray) -> np.ndarray:
    """_curand_box_muller's host branch, in single precision: each pair of values gives two standard normals."""
    x, y = bits[0::2], bits[1::2]
    u = x.astype(np.float32) * INV32 + np.float32(INV32 / np.float32(2))
    v = y.astype(np.float32) * INV32_2PI + np.float32(INV32_2PI / np.float32(2))
    s = np.sqrt(np.float32(-2) * np.log(u))
    return np.stack([np.sin(v) * s, np.cos(v) * s], axis=1).reshape(-1)


def box_muller_double(bits: np.ndarray) -> np.ndarray:
    """_curand_box_muller_double's host branch: each four values give two standard normals."""
    x0, x1, y0, y1 = bits[0::4], bits[1::4], bits[2::4], bits[3::4]
    u = (x0 ^ (x1 << np.uint64(21))).astype(np.float64) * INV53 + INV53 / 2
    v = (y0 ^ (y1 << np.uint64(21))).astype(np.float64) * (INV53 * 2) + INV53
    s = np.sqrt(-2.0 * np.log(u))
    return np.stack([np.sin(v * np.pi) * s, np.cos(v * np.pi) * s], axis=1).reshape(-1)


def _cdf(ks: np.ndarray, log_pmf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cdf = np.cumsum(np.exp(log_pmf - log_pmf.max()))
    return ks, cdf / cdf[-1]


def _lgamma(values: np.ndarray) -> np.ndarray:
    return np.array([math.lgamma(v) for v in values.tolist()])


def poisson_cdf(lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Poisson(lam)'s values and CDF over lam +- 12 standard deviations (the mass beyond is below 1e-30)."""
    spread = 12 * math.sqrt(lam) + 12
    ks = np.arange(max(0, math.floor(lam - spread)), math.ceil(lam + spread) + 1, dtype=np.float64)
    return _cdf(ks, ks * math.log(lam) - lam - _lgamma(ks + 1))


def binomial_cdf(n: int, p: float) -> tuple[np.ndarray, np.ndarray]:
    """Binomial(n, p)'s values and CDF over its mean +- 12 standard deviations."""
    if p in (0.0, 1.0):
        return np.array([n * p]), np.array([1.0])
    mean, spread = n * p, 12 * math.sqrt(n * p * (1 - p)) + 12
    ks = np.arange(max(0, math.floor(mean - spread)), min(n, math.ceil(mean + spread)) + 1, dtype=np.float64)
    log_pmf = (math.lgamma(n + 1) - _lgamma(ks + 1) - _lgamma(n - ks + 1) + ks * math.log(p)
               + (n - ks) * math.log1p(-p))
    return _cdf(ks, log_pmf)


def invert(ks: np.ndarray, cdf: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """The discrete values whose CDF first reaches each uniform (inversion: exact in distribution)."""
    u = bits.astype(np.float64) * 2.0 ** -32 + 2.0 ** -33
    return ks[np.minimum(np.searchsorted(cdf, u), len(ks) - 1)].astype(np.uint32)


def _even(n: int) -> None:
    if n % 2:
        raise refuse("length_not_multiple", f"{n} normal values: a pseudorandom generator's count must be even "
                     "(Box-Muller makes them in pairs)")
