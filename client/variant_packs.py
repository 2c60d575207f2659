"""cuDNN's backend API in the client: variant packs kept here (or in C) and sent with their execution, and the
attribute calls of backend descriptors, their arrays sized by their element type."""

from __future__ import annotations

import struct
from typing import Any

from xpuremote.protocol import errors, mathlibs, wire
from xpuremote.protocol.calls import CALLS, Call

from . import marshal, memory
from . import mathlibs as base
from .driver import Driver, implements
from .mathlibs import PACK_UIDS, PACK_WORKSPACE, STATE, TYPE_DESCRIPTOR, VARIANT_PACK, _created, remember


@implements("cudnnBackendCreateDescriptor")
def backend_create(d: Driver, call: Call, args: list[Any]) -> None:
    if args[0] == VARIANT_PACK and args[1]:  # kept here until it executes (see `backend_execute`)
        d.session()
        handle = d.new_handle()
        marshal.put_u64(args[1], handle)
        STATE[handle] = {"descriptor_type": VARIANT_PACK, "kept": {}, "finalized": False}
        return
    d.forward(call, args)
    STATE[_created(call, args)] = {"descriptor_type": args[0]}


@implements("cudnnBackendFinalize")
def backend_finalize(d: Driver, call: Call, args: list[Any]) -> None:
    """Waits for its answer (finalizing an engine's plan may fail, and callers rely on hearing it),
    except a variant pack's, made and finalized before every execution: kept here, or queued (a failure
    surfaces at the next call that waits, as an execution's would)."""
    _kept(args[0])  # one C keeps is taken over
    pack = STATE.get(args[0], {})
    if "kept" in pack and not pack["finalized"]:
        pack["finalized"] = True
    elif pack.get("descriptor_type") == VARIANT_PACK:
        _send_pack(d, args[0])
        d.post(call, list(args))
    else:
        d.forward(call, args)


# ---- cuDNN's variant packs: kept here, sent with their execution --------------------------------------
# PyTorch (cudnn-frontend) makes, fills, finalizes, executes and destroys a variant pack for every convolution
# it runs: seven calls, each a message's call for the client and the server. A pack is kept instead (in C with
# the shim, the execution reading it there) and goes as one xpuCudnnExecute, which the server runs as those calls.
# A pack used any other way is taken over from C and sent as it was made (`_send_pack`), and from then on its
# calls go to the server.


def _kept(handle: int, adopt: bool = True) -> dict[str, Any] | None:
    """A variant pack kept here, or in C (taken over, unless it is only read for its execution)."""
    pack = STATE.get(handle)
    if pack is None and base.IN_C is not None:
        pack = base.IN_C.pack(handle, adopt)
        if adopt and pack is not None:
            STATE[handle] = pack
    return pack if pack is not None and "kept" in pack else None


def _send_pack(d: Driver, handle: int) -> None:
    """A kept pack made on the server as the application made it: created, its attributes set, finalized."""
    pack = _kept(handle)
    if pack is None:
        return
    kept = pack.pop("kept")
    d.post(CALLS["cudnnBackendCreateDescriptor"], [VARIANT_PACK, handle])
    for name, (attribute_type, count, raw) in kept.items():
        _post_attribute(d, handle, name, attribute_type, count, raw)
    if pack.pop("finalized"):
        d.post(CALLS["cudnnBackendFinalize"], [handle])


def _send_packs(d: Driver, handles: bytes) -> None:
    """Kept packs among an array of descriptors: the server must have them."""
    for (handle,) in struct.iter_unpack("<Q", handles):
        _send_pack(d, handle)


def _execution(d: Driver, pack: dict[str, Any]) -> list[Any] | None:
    """xpuCudnnExecute's arguments after the handle and plan, for a finalized pack of data pointers, as many
    unique ids and at most a workspace; None for any other."""
    kept = pack["kept"]
    pointers, uids = kept.get(mathlibs.CUDNN_DATA_POINTERS), kept.get(PACK_UIDS)
    workspace = kept.get(PACK_WORKSPACE, (0, 1, bytes(8)))
    if not pack["finalized"] or pointers is None or uids is None or pointers[1] != uids[1] or workspace[1] != 1 \
            or len(kept) != 2 + (PACK_WORKSPACE in kept):
        return None
    count, raw = pointers[1], pointers[2]
    flags, scalars = _by_value_scalars(d, raw) or (bytes(count), bytes(8 * count))
    if base.IN_C is not None:  # C queues the next execution itself: it knows device memory, and these scalars
        base.IN_C.watch_device(memory.maps(d)[0])
        if any(flags):
            base.IN_C.learn_scalars(raw, flags)
    return [count, int.from_bytes(workspace[2], "little"), mathlibs.execute_pack(raw, uids[2], scalars, flags)]


@implements("cudnnBackendExecute")
def backend_execute(d: Driver, call: Call, args: list[Any]) -> None:
    handle, plan, pack_handle = args
    pack = _kept(pack_handle, adopt=False)  # C keeps it on for its destroy
    if pack is not None:
        sent = _execution(d, pack)
        if sent is not None:
            count, workspace, data = sent
            d.post(CALLS["xpuCudnnExecute"], [handle, plan, count, workspace, wire.frame(data)], len(data))
            return
        _send_pack(d, pack_handle)
    d.forward(call, args)


# ---- cuDNN's backend API: attribute arrays sized by their element type ------------------------------



def _elements_bytes(attribute_type: int, count: int) -> int:
    if count < 0:
        raise errors.library_error("cudnn", "invalid_value", f"an element count of {count}")
    return count * struct.calcsize("<" + mathlibs.cudnn_format(attribute_type))


@implements("cudnnBackendSetAttribute")
def backend_set_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    descriptor, name, attribute_type, count, array = args
    size = _elements_bytes(attribute_type, count)
    if size and not array:
        raise errors.library_error("cudnn", "invalid_value", "NULL arrayOfElements")
    raw = marshal.read(array, size) if size else b""
    pack = _kept(descriptor)
    if pack is not None and mathlibs.CUDNN_PACK_ATTRIBUTES.get(name) == attribute_type and not pack["finalized"]:
        pack["kept"][name] = (attribute_type, count, raw)
        return
    _send_pack(d, descriptor)
    if attribute_type == TYPE_DESCRIPTOR:
        _send_packs(d, raw)
    _post_attribute(d, descriptor, name, attribute_type, count, raw)


def _post_attribute(d: Driver, descriptor: int, name: int, attribute_type: int, count: int, raw: bytes) -> None:
    size = len(raw)
    pointers = name == mathlibs.CUDNN_DATA_POINTERS and attribute_type == mathlibs.CUDNN_VOID_PTR
    if pointers and (scalars := _by_value_scalars(d, raw)):
        d.post(CALLS["xpuCudnnSetDataPointers"], [descriptor, count, wire.frame(raw), *map(wire.frame, scalars)],
               size)
        return
    d.post(CALLS["cudnnBackendSetAttribute"],
           [descriptor, name, attribute_type, count, wire.frame(raw) if size else None], size)


# a variant pack's pointers -> the device memory map's `changes` when they were all found in it (or NULL)
ON_DEVICE: dict[bytes, int] = {}


def _by_value_scalars(d: Driver, pointers: bytes) -> tuple[bytes, bytes] | None:
    """A variant pack's pointer outside device memory, readable here, is a by-value scalar's (cudnn-frontend
    passes attention scales so): which ones, and their bytes, 8 each (the widest scalar), for the server to
    hold where its cuDNN reads them. None where there is none."""
    devices = memory.maps(d)[0]
    if ON_DEVICE.get(pointers) == devices.changes:  # PyTorch's caching allocator gives a step the same addresses
        return None
    flags, scalars = bytearray(len(pointers) // 8), bytearray(len(pointers))
    on_device = True
    for i, (address,) in enumerate(struct.iter_unpack("<Q", pointers)):
        if not address or devices.find(address) is not None:
            continue
        on_device = False
        if (found := memory.host_bytes(address, 8)) is not None:
            flags[i], scalars[8 * i:8 * i + len(found)] = 1, found
    if on_device:
        remember(ON_DEVICE, pointers, devices.changes)
        return None
    return (bytes(flags), bytes(scalars)) if any(flags) else None



@implements("cudnnBackendGetAttribute")
def backend_get_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    """Descriptor-valued attributes fill descriptors the caller made beforehand: those go to the
    server as handles (xpuCudnnGetDescriptors); other values come back as bytes."""
    descriptor, name, attribute_type, requested, count_out, array = args
    size = _elements_bytes(attribute_type, requested) if array else 0  # NULL: a question of the count
    _send_pack(d, descriptor)
    if attribute_type == TYPE_DESCRIPTOR:
        raw = marshal.read(array, size) if size else b""
        _send_packs(d, raw)
        handles = wire.frame(raw) if size else None
        (count,) = d.call(CALLS["xpuCudnnGetDescriptors"], [descriptor, name, size // 8, handles, 1])
        if count_out:
            marshal.write(count_out, count)
        return
    count, data = d.call(call, [descriptor, name, attribute_type, requested, 8, size or None])
    if count_out:  # NULL is allowed (the stock PyTorch passes it)
        marshal.write(count_out, count)
    # cuDNN writes the elements the attribute holds, up to the request: callers size their arrays by
    # an earlier count and may still request more (the stock PyTorch's numerical notes)
    held = max(0, min(requested, int.from_bytes(count, "little", signed=True)))
    marshal.write(array, data[:_elements_bytes(attribute_type, held)] if data else None)
