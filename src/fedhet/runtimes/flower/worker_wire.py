"""What the ClientApp and the fedhet worker send each other: Flower's own protobuf records, never pickles.

A request is the message kind, its content (`RecordDict`) and the node's `Context`; a reply is "ok" with the
reply content and the updated `context.state`, or "error" with a one-line reason. Records and contexts travel
as Flower's protobuf messages (`flwr.common.serde`, the serialisation of Flower's own gRPC transport: arrays are
NumPy bytes loaded with `allow_pickle=False`), framed as length-prefixed parts in one `send_bytes` message. So
reading a message rebuilds tensors, numbers and strings only: even a peer holding the channel's key cannot make
the worker (or the ClientApp) run code by what it sends; a malformed message is a `WireError`.
Flower only (no torch): the lean ClientApp imports it.
"""

from __future__ import annotations

import struct

from flwr.app import Context, RecordDict
from flwr.common.serde import context_from_proto, context_to_proto, recorddict_from_proto, recorddict_to_proto
from flwr.proto.message_pb2 import Context as ProtoContext
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

OK, ERROR = "ok", "error"
_LENGTH = struct.Struct("!Q")


class WireError(ValueError):
    """A channel message that is not a well-formed request or reply."""


def pack(*parts: bytes) -> bytes:
    """The parts as one message: each preceded by its length (8 bytes, big-endian)."""
    return b"".join(_LENGTH.pack(len(p)) + p for p in parts)


def unpack(data: bytes, count: int) -> list[bytes]:
    """The `count` parts of a `pack`ed message; a WireError when it is not exactly that."""
    parts, pos = [], 0
    for _ in range(count):
        if pos + _LENGTH.size > len(data):
            raise WireError(f"a message of {len(data)} bytes is shorter than its {count} parts")
        (size,), pos = _LENGTH.unpack_from(data, pos), pos + _LENGTH.size
        if pos + size > len(data):
            raise WireError(f"a message part of {size} bytes runs past the message's {len(data)} bytes")
        parts.append(data[pos:pos + size])
        pos += size
    if pos != len(data):
        raise WireError(f"{len(data) - pos} bytes follow the message's {count} parts")
    return parts


def _records(data: bytes) -> RecordDict:
    proto = ProtoRecordDict()
    proto.ParseFromString(data)
    return recorddict_from_proto(proto)


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise WireError(f"a text part is not UTF-8 ({err})") from None


def request_bytes(kind: str, content: RecordDict, context: Context) -> bytes:
    """A request: the message kind, its content and the node's context (its state included)."""
    return pack(kind.encode(), recorddict_to_proto(content).SerializeToString(),
                context_to_proto(context).SerializeToString())


def read_request(data: bytes) -> tuple[str, RecordDict, Context]:
    """(kind, content, context) of a request; a WireError when malformed."""
    kind, content, context = unpack(data, 3)
    try:
        proto = ProtoContext()
        proto.ParseFromString(context)
        return _text(kind), _records(content), context_from_proto(proto)
    except WireError:
        raise
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError, or a record Flower refuses to build
        raise WireError(f"not a Flower RecordDict / Context ({type(err).__name__}: {err})") from None


def reply_bytes(content: RecordDict, state: RecordDict) -> bytes:
    """A successful reply: the reply content and the updated `context.state`."""
    return pack(OK.encode(), recorddict_to_proto(content).SerializeToString(),
                recorddict_to_proto(state).SerializeToString())


def error_bytes(reason: str) -> bytes:
    """A failed request's reply: its one-line reason."""
    return pack(ERROR.encode(), reason.encode(), b"")


def read_reply(data: bytes) -> tuple[RecordDict, RecordDict] | str:
    """(content, state) of a successful reply, or the reason of an error reply; a WireError when malformed."""
    status, first, second = unpack(data, 3)
    if status == ERROR.encode():
        return _text(first)
    if status != OK.encode():
        raise WireError(f"unknown reply status {status[:20]!r}")
    try:
        return _records(first), _records(second)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError, or a record Flower refuses to build
        raise WireError(f"not a Flower RecordDict ({type(err).__name__}: {err})") from None
