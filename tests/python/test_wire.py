"""The client's hand-written request bytes (mcstore._wire, mcstore._core's prepared-slices and
block-layout paths) against store.proto: built from a copy of proto/ in which the fields those
paths write are renumbered, the requests must still parse as the intended messages; with one of
them retyped, importing the client must fail naming the field. Each case runs in a subprocess
whose mcstore.v1 stubs are generated from the altered copy."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

SOURCE_DIR = os.environ.get("MC_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))

# (message, field, new number): fields the hand encoding writes, moved past 15 (two-byte keys)
# and clear of numbers the .proto uses or may use next.
RENUMBER = [("Slice", "buffer_id", 107), ("Slice", "length", 109), ("Slice", "offset", 121),
            ("StridedSlice", "stride", 105), ("StridedSlice", "buffer_id", 117),
            ("LayoutBlock", "index", 103),
            ("GetItem", "key", 104), ("GetItem", "slices", 117), ("GetItem", "block", 102),
            ("PutItem", "slices", 106), ("PutItem", "block", 116),
            ("BatchGetRequest", "items", 105), ("BatchGetRequest", "lease_id", 120),
            ("BatchGetRequest", "block_layout", 101), ("BatchGetRequest", "lease_token", 114),
            ("BatchPutRequest", "replicas", 119), ("BatchPutRequest", "block_layout", 118)]

# Builds requests through both paths and compares the parsed messages.
CHECK = textwrap.dedent("""
    import sys
    import mcstore
    mcstore.__path__.insert(0, sys.argv[1])    # mcstore.v1: the altered stubs
    from mcstore import Slice, _core, _wire
    from mcstore.v1 import store_pb2 as spb
    assert spb.__file__.startswith(sys.argv[1]), spb.__file__

    class Owner:
        pass

    checker = _core.SliceChecker(Owner())
    checker.sizes[77] = 1 << 40
    geoms = [[Slice(77, 0, 5)], [Slice(77, 300, 1 << 20), Slice(77, 1 << 33, 7)]]
    keys = [b"", b"k" * 200]
    prepared = [_core.PreparedSlices(g, checker) for g in geoms]
    for lease in (None, 300, (300, b"t" * 16)):
        raw, _, _ = _core.build_get(keys, prepared, lease, checker)
        ref, _, _ = _core.build_get(keys, geoms, lease, checker)
        assert type(raw) is bytes and spb.BatchGetRequest.FromString(raw) == ref, lease
    for replicas in (None, 3):
        raw, _ = _core.build_put(keys, prepared, replicas, checker)
        ref, _ = _core.build_put(keys, geoms, replicas, checker)
        assert type(raw) is bytes and spb.BatchPutRequest.FromString(raw) == ref, replicas
    runs = [(Slice(77, 5, 300), 1 << 20), (Slice(77, 0, 7), 0)]
    layout = _core.BlockLayout(runs, checker)
    idx = [0, 1, 200]
    raw, _, _ = _core.build_get(keys + [b"x"], layout.blocks(idx), (9, b"c" * 16), checker)
    ref = spb.BatchGetRequest(lease_id=9, lease_token=b"c" * 16)
    for k, i in zip(keys + [b"x"], idx):
        ref.items.add(key=k).block.index = i
    for sl, st in runs:
        ref.block_layout.add(buffer_id=77, offset=sl.offset, length=sl.length, stride=st)
    assert spb.BatchGetRequest.FromString(raw) == ref
    raw, _ = _core.build_put(keys + [b"x"], layout.blocks(idx), 2, checker)
    ref = spb.BatchPutRequest(replicas=2)
    for k, i in zip(keys + [b"x"], idx):
        ref.items.add(key=k).block.index = i
    for sl, st in runs:
        ref.block_layout.add(buffer_id=77, offset=sl.offset, length=sl.length, stride=st)
    assert spb.BatchPutRequest.FromString(raw) == ref
    print("keys", _wire.GET_ITEM_SLICES.hex(), _wire.GET_LEASE_ID.hex())
""")


def _altered_stubs(tmp_path, edit):
    """Stubs generated from a copy of proto/ whose store.proto went through edit(text)."""
    from mcstore import _protogen
    proto = tmp_path / "proto"
    for rel in _protogen.PROTO_FILES:
        src = os.path.join(SOURCE_DIR, "proto", rel)
        dst = proto / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(src) as f:
            text = f.read()
        dst.write_text(edit(text) if rel.endswith("store.proto") else text)
    out = tmp_path / "gen"
    _protogen.generate(str(proto), str(out))
    return str(out / "mcstore")


def _set_number(text, message, field, number):
    """store.proto with `message`.`field` given `number` (the field's line keeps its type)."""
    body = re.search(r"\bmessage %s \{(.*?)\}" % message, text, re.S)
    assert body, message
    new_body, n = re.subn(r"(\b%s = )\d+;" % field, r"\g<1>%d;" % number, body.group(1))
    assert n == 1, (message, field)
    return text[:body.start(1)] + new_body + text[body.end(1):]


def _run(stubs):
    return subprocess.run([sys.executable, "-c", CHECK, stubs], capture_output=True, text=True,
                          timeout=120)


def test_unchanged_proto_passes_the_check(tmp_path):
    r = _run(_altered_stubs(tmp_path, lambda t: t))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "keys 12 10" in r.stdout   # GetItem.slices = 2, BatchGetRequest.lease_id = 2


def test_renumbered_fields_are_followed(tmp_path):
    def edit(text):
        for message, field, number in RENUMBER:
            text = _set_number(text, message, field, number)
        return text
    r = _run(_altered_stubs(tmp_path, edit))
    assert r.returncode == 0, r.stdout + r.stderr
    # GetItem.slices = 117 and BatchGetRequest.lease_id = 120: two-byte keys.
    assert "keys aa07 c007" in r.stdout


@pytest.mark.parametrize("message,old,new", [
    ("Slice", "uint64 offset", "string offset"),
    ("BatchGetRequest", "uint64 lease_id", "repeated uint64 lease_id"),
    ("GetItem", "LayoutBlock block", "bytes block"),
])
def test_retyped_field_stops_the_import(tmp_path, message, old, new):
    def edit(text):
        body = re.search(r"\bmessage %s \{(.*?)\}" % message, text, re.S)
        assert body and old in body.group(1), (message, old)
        return text[:body.start(1)] + body.group(1).replace(old, new) + text[body.end(1):]
    r = _run(_altered_stubs(tmp_path, edit))
    assert r.returncode != 0
    field = old.split()[-1]
    assert "mcstore.v1.%s.%s" % (message, field) in r.stderr, r.stderr
