"""cuRAND (host API) in the client: its generators, and what cuRAND answers at once.

Generators are client-made; their settings and generations take the generic path of the call table (queued on the
generator's stream, writing device memory). What is written here:
- the generator's creation, after the check that the server's cuRAND is of the major version these calls are made
  for; the client keeps each generator's type and dimensions;
- what cuRAND refuses at the call itself, answered here from them rather than at the next wait (a queued call's
  failure would surface there): a type's wrong call (a seed for a quasirandom generator, 64-bit values from a
  32-bit one), an odd count of normal values from a pseudorandom generator, a count that is not a multiple of a
  quasirandom generator's dimensions, an ordering or a Poisson lambda out of range;
- curandCreateGeneratorHost, refused (said once): its generations write host memory, which the server cannot;
- the versions, of the server's copy (the library that runs the calls).
Under the shim, a generator's generations of a kind are queued in C (interpose/kept.h) after the first passed these
checks, for counts that pass them too (a multiple of what `let` says), until the generator's dimensions change or it
is destroyed; any other comes here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xpuremote.protocol import errors, mathlibs
from xpuremote.protocol.calls import Call
from xpuremote.protocol.errors import CudaError

from . import marshal
from . import mathlibs as in_client
from .driver import Driver, implements
from .mathlibs import _created, _property, check_version, version_of

ENUMS = mathlibs.api(mathlibs.CURAND).ENUMS
PSEUDO = {ENUMS[f"CURAND_RNG_PSEUDO_{t}"] for t in ("DEFAULT", "XORWOW", "MRG32K3A", "MTGP32", "MT19937",
                                                    "PHILOX4_32_10")}
QUASI_32 = {ENUMS[f"CURAND_RNG_QUASI_{t}"] for t in ("DEFAULT", "SOBOL32", "SCRAMBLED_SOBOL32")}
QUASI_64 = {ENUMS[f"CURAND_RNG_QUASI_{t}"] for t in ("SOBOL64", "SCRAMBLED_SOBOL64")}
PSEUDO_ORDERINGS = {ENUMS[f"CURAND_ORDERING_PSEUDO_{o}"] for o in ("BEST", "DEFAULT", "SEEDED", "LEGACY", "DYNAMIC")}
QUASI_ORDERINGS = {ENUMS["CURAND_ORDERING_QUASI_DEFAULT"]}
MAX_DIMENSIONS = 20_000
POISSON_MAX = 400_000


@dataclass
class Generator:
    rng_type: int
    dimensions: int = 1

    @property
    def pseudo(self) -> bool:
        return self.rng_type in PSEUDO


GENERATORS: dict[int, Generator] = {}  # client handle -> what cuRAND's immediate answers need


def refuse(outcome: str, message: str) -> CudaError:
    return errors.library_error("curand", outcome, message)


def _generator(handle: int) -> Generator:
    found = GENERATORS.get(handle)
    if found is None:
        raise refuse("not_initialized", f"{handle:#x} is not a live cuRAND generator")
    return found


def _connected(d: Driver) -> None:
    """NVIDIA's cuRAND starts the runtime, and so the driver, at its first generator: so does this one."""
    if d.conn is None:
        try:
            d.connect()
        except CudaError as exc:
            raise refuse("initialization_failed", exc.detail) from None


@implements("curandCreateGenerator")
def create(d: Driver, call: Call, args: list[Any]) -> None:
    rng_type = args[1]
    if rng_type not in PSEUDO | QUASI_32 | QUASI_64:
        raise refuse("type_error", f"curandCreateGenerator: {rng_type} is not a generator type")
    if not args[0]:
        raise refuse("not_initialized", "curandCreateGenerator: NULL generator")
    _connected(d)
    check_version(d, mathlibs.CURAND)
    d.forward(call, args)
    GENERATORS[_created(call, args)] = Generator(rng_type)


@implements("curandCreateGeneratorHost")
def create_host(d: Driver, call: Call, args: list[Any]) -> None:
    message = ("curandCreateGeneratorHost is not supported by xpuremote: a host generator writes its numbers into "
               "this process's memory, which the server cannot write; use curandCreateGenerator and copy them back")
    d.say_once(call.symbol, "%s (returning CURAND_STATUS_ARCH_MISMATCH)", message)
    raise refuse("not_supported", message)


@implements("curandDestroyGenerator")
def destroy(d: Driver, call: Call, args: list[Any]) -> None:
    _generator(args[0])
    in_client.forget_in_c(call, args[0])
    d.forward(call, args)
    GENERATORS.pop(args[0], None)


@implements("curandSetPseudoRandomGeneratorSeed")
def set_seed(d: Driver, call: Call, args: list[Any]) -> None:
    if not _generator(args[0]).pseudo:
        raise refuse("type_error", "curandSetPseudoRandomGeneratorSeed: a quasirandom generator has no seed")
    d.forward(call, args)


@implements("curandSetGeneratorOrdering")
def set_ordering(d: Driver, call: Call, args: list[Any]) -> None:
    gen = _generator(args[0])
    if args[1] not in (PSEUDO_ORDERINGS if gen.pseudo else QUASI_ORDERINGS):
        raise refuse("invalid_value", f"curandSetGeneratorOrdering: {args[1]} is not an ordering of a "
                     f"{'pseudo' if gen.pseudo else 'quasi'}random generator")
    d.forward(call, args)


@implements("curandSetQuasiRandomGeneratorDimensions")
def set_dimensions(d: Driver, call: Call, args: list[Any]) -> None:
    gen = _generator(args[0])
    if gen.pseudo:
        raise refuse("type_error", "curandSetQuasiRandomGeneratorDimensions: a pseudorandom generator has none")
    if not 1 <= args[1] <= MAX_DIMENSIONS:
        raise refuse("invalid_value", f"{args[1]} dimensions (1 to {MAX_DIMENSIONS})")
    in_client.forget_in_c(call, args[0])  # the counts C may take change
    d.forward(call, args)
    gen.dimensions = args[1]


def _let(gen: Generator, call: Call, handle: int, pairs: bool = False) -> None:
    """C queues `call` of this generator from now on for the counts `_count` lets pass: a multiple of a quasirandom
    generator's dimensions, of 2 for a pseudorandom generator's normal values."""
    in_client.let_in_c(call, handle, gen.dimensions if not gen.pseudo else 2 if pairs else 1)


def _count(gen: Generator, call: Call, count: int, pairs: bool = False) -> None:
    """cuRAND's rule for a count: a multiple of a quasirandom generator's dimensions; even for normal values of a
    pseudorandom one (Box-Muller makes them in pairs)."""
    if gen.pseudo and pairs and count % 2:
        raise refuse("length_not_multiple", f"{call.symbol}: {count} values from a pseudorandom generator (even "
                     "counts only)")
    if not gen.pseudo and count % gen.dimensions:
        raise refuse("length_not_multiple", f"{call.symbol}: {count} values in {gen.dimensions} dimensions")


@implements("curandGenerate", "curandGenerateUniform", "curandGenerateUniformDouble")
def generate(d: Driver, call: Call, args: list[Any]) -> None:
    gen = _generator(args[0])
    if call.family == "curandGenerate" and gen.rng_type in QUASI_64:
        raise refuse("type_error", "curandGenerate: a 64-bit quasirandom generator makes 64-bit values "
                     "(curandGenerateLongLong)")
    _count(gen, call, args[2])
    d.forward(call, args)
    _let(gen, call, args[0])


@implements("curandGenerateLongLong")
def generate_long_long(d: Driver, call: Call, args: list[Any]) -> None:
    gen = _generator(args[0])
    if gen.rng_type not in QUASI_64:
        raise refuse("type_error", "curandGenerateLongLong needs a 64-bit quasirandom generator")
    _count(gen, call, args[2])
    d.forward(call, args)
    _let(gen, call, args[0])


@implements("curandGenerateNormal", "curandGenerateNormalDouble", "curandGenerateLogNormal",
            "curandGenerateLogNormalDouble")
def generate_normal(d: Driver, call: Call, args: list[Any]) -> None:
    gen = _generator(args[0])
    _count(gen, call, args[2], pairs=True)
    d.forward(call, args)
    _let(gen, call, args[0], pairs=True)


@implements("curandGeneratePoisson")
def generate_poisson(d: Driver, call: Call, args: list[Any]) -> None:
    gen = _generator(args[0])
    if not 0 < args[3] <= POISSON_MAX:
        raise refuse("invalid_value", f"curandGeneratePoisson: lambda {args[3]} is not in (0, {POISSON_MAX}]")
    _count(gen, call, args[2])
    d.forward(call, args)


@implements("curandGetVersion")
def get_version(d: Driver, call: Call, args: list[Any]) -> None:
    """CURAND_VERSION's form (major * 1000 + minor * 100 + patch) of the server's copy."""
    if not args[0]:
        raise refuse("invalid_value", "curandGetVersion: NULL output")
    major, minor, patch = version_of(d, mathlibs.CURAND)
    marshal.put(call.params[0], args[0], major * 1000 + minor * 100 + patch)


implements("curandGetProperty")(_property)
