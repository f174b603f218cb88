"""The protobuf field keys that _core's fast path writes by hand, read from the generated
descriptors of store.proto, never typed in.

_core writes BatchGet/BatchPut requests of prepared slices and block layouts straight as bytes
(a batch of 63 blocks: 0.12-0.2 ms instead of 1.3 ms through the message classes). The field
numbers it needs come from here, so they follow the .proto the package was built from; each
field's type and cardinality are checked against what the hand encoding writes when this module
is imported, so a field retyped in proto/ (a uint64 turned string, a singular field made
repeated) stops the import with the field named, instead of putting wrong bytes on the wire.
tests/python/test_wire.py builds the package's requests against a renumbered and a retyped
store.proto to prove both.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from mcstore._proto import store_pb2

_VARINT = 0            # wire type of the integer fields written here
_LENGTH_DELIMITED = 2  # wire type of bytes, strings and messages


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of an unsigned 64-bit integer."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _types() -> Dict[str, Tuple[int, ...]]:
    from google.protobuf.descriptor import FieldDescriptor as F
    return {"uint": (F.TYPE_UINT64, F.TYPE_UINT32), "bytes": (F.TYPE_BYTES,),
            "message": (F.TYPE_MESSAGE,)}


def _key(spb: Any, message: str, field: str, kind: str, repeated: bool) -> bytes:
    """The key (number << 3 | wire type, as a varint) of `message`.`field`, after checking the
    field is of `kind` ("uint": a varint uint64/uint32; "bytes"; "message") and repeated or
    singular as the hand encoding writes it."""
    from google.protobuf.descriptor import FieldDescriptor as F
    desc = getattr(spb, message).DESCRIPTOR
    f = desc.fields_by_name.get(field)
    where = "mcstore.v1.%s.%s" % (message, field)
    if f is None:
        raise ImportError("mcstore: %s is not in the generated store.proto stubs; the client's "
                          "request encoding (mcstore._wire) needs it" % where)
    if f.type not in _types()[kind]:
        raise ImportError("mcstore: %s has protobuf type %d in the generated stubs; the client's "
                          "request encoding (mcstore._wire) writes it as %s"
                          % (where, f.type, kind))
    is_repeated = f.is_repeated if hasattr(f, "is_repeated") else f.label == F.LABEL_REPEATED
    if is_repeated != repeated:
        raise ImportError("mcstore: %s is %s in the generated stubs; the client's request "
                          "encoding (mcstore._wire) writes it %s"
                          % (where, "repeated" if is_repeated else "singular",
                             "repeated" if repeated else "singular"))
    return varint(f.number << 3 | (_VARINT if kind == "uint" else _LENGTH_DELIMITED))


_spb = store_pb2()

SLICE_BUFFER_ID = _key(_spb, "Slice", "buffer_id", "uint", False)
SLICE_OFFSET = _key(_spb, "Slice", "offset", "uint", False)
SLICE_LENGTH = _key(_spb, "Slice", "length", "uint", False)
STRIDED_BUFFER_ID = _key(_spb, "StridedSlice", "buffer_id", "uint", False)
STRIDED_OFFSET = _key(_spb, "StridedSlice", "offset", "uint", False)
STRIDED_LENGTH = _key(_spb, "StridedSlice", "length", "uint", False)
STRIDED_STRIDE = _key(_spb, "StridedSlice", "stride", "uint", False)
LAYOUT_BLOCK_INDEX = _key(_spb, "LayoutBlock", "index", "uint", False)

GET_ITEM_KEY = _key(_spb, "GetItem", "key", "bytes", False)
GET_ITEM_SLICES = _key(_spb, "GetItem", "slices", "message", True)
GET_ITEM_BLOCK = _key(_spb, "GetItem", "block", "message", False)
PUT_ITEM_KEY = _key(_spb, "PutItem", "key", "bytes", False)
PUT_ITEM_SLICES = _key(_spb, "PutItem", "slices", "message", True)
PUT_ITEM_BLOCK = _key(_spb, "PutItem", "block", "message", False)

GET_ITEMS = _key(_spb, "BatchGetRequest", "items", "message", True)
GET_LEASE_ID = _key(_spb, "BatchGetRequest", "lease_id", "uint", False)
GET_BLOCK_LAYOUT = _key(_spb, "BatchGetRequest", "block_layout", "message", True)
GET_LEASE_TOKEN = _key(_spb, "BatchGetRequest", "lease_token", "bytes", False)
PUT_ITEMS = _key(_spb, "BatchPutRequest", "items", "message", True)
PUT_REPLICAS = _key(_spb, "BatchPutRequest", "replicas", "uint", False)
PUT_BLOCK_LAYOUT = _key(_spb, "BatchPutRequest", "block_layout", "message", True)

del _spb
