"""kvtier's KV-events decoder against vLLM 0.33.0's: hostile payloads, generated field by field
(each field at its type's edges and of every other msgpack type, missing, repeated, among
unknown keys, cut short, nested deep), decoded by ``msgspec.msgpack.Decoder(KVEventBatch)`` as
vLLM's subscribers build it.

The corpus and vLLM's answers live in ``tests/data/kv_events/decoder-corpus.tsv``: one payload a
line, ``name, accept|reject, payload hex, msgspec's re-encoding of the decoded batch (hex)``.
This test checks that the file is exactly what vLLM answers today; kvtier's unit test
(``kv_events::decode``'s ``matches_vllm_on_the_corpus``) checks that kvtier's decoder gives the
same answer and, for an accepted payload, that kvtier re-encodes what it decoded to the same
bytes (so the same values). ``KVTIER_REGEN_CORPUS=1`` rewrites the file instead. The last test
sends the accepted payloads through a ZMQ socket to ``kvtier events`` itself, which must print
msgspec's values of each and then stop at a rejected one.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import pathlib
import re
import struct
import subprocess
import time

import msgspec
import zmq

from test_kv_events import _hexed, ke, kvtier_bin  # noqa: F401 (a fixture)

ROOT = pathlib.Path(__file__).resolve().parents[3]
CORPUS = ROOT / "tests" / "data" / "kv_events" / "decoder-corpus.tsv"

P = msgspec.msgpack.encode


def _u(marker: int, fmt: str, v: int) -> bytes:
    return bytes([marker]) + struct.pack(fmt, v)


def _str(b: bytes) -> bytes:
    n = len(b)
    if n < 32:
        return bytes([0xA0 | n]) + b
    return b"\xd9" + bytes([n]) + b if n < 256 else b"\xda" + struct.pack(">H", n) + b


def _arr(items: list[bytes]) -> bytes:
    n = len(items)
    head = bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n)
    return head + b"".join(items)


def _map(pairs: list[tuple[bytes, bytes]]) -> bytes:
    n = len(pairs)
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)
    return head + b"".join(k + v for k, v in pairs)


def _k(name: str) -> bytes:
    return P(name)


# Values of every msgpack type, integers at every width's edges (in their shortest form and
# in wider ones), floats of both widths, text that is not UTF-8, extensions.
INTS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
        2**63 - 1, 2**63, 2**64 - 1, -1, -32, -33, -128, -129, -(2**15), -(2**15) - 1,
        -(2**31), -(2**31) - 1, -(2**63)]
VALUES: list[tuple[str, bytes]] = [(f"int {i}", P(i)) for i in INTS] + [
    ("uint64 5", _u(0xCF, ">Q", 5)),
    ("int64 5", _u(0xD3, ">q", 5)),
    ("int8 -1", _u(0xD0, ">b", -1)),
    ("uint16 7", _u(0xCD, ">H", 7)),
    ("float 0.0", P(0.0)),
    ("float -0.0", P(-0.0)),
    ("float 1.5", P(1.5)),
    ("float 16.0", P(16.0)),
    ("float inf", P(float("inf"))),
    ("float32 2.5", b"\xca" + struct.pack(">f", 2.5)),
    ("true", P(True)),
    ("false", P(False)),
    ("nil", P(None)),
    ("str", P("GPU")),
    ("str empty", P("")),
    ("str8", b"\xd9\x03GPU"),
    ("str not utf-8", b"\xa2\xff\xfe"),
    ("bin", P(b"\x01\x02")),
    ("bin empty", P(b"")),
    ("bin32", b"\xc6\x00\x00\x00\x01\x07"),
    ("array empty", P([])),
    ("array [1]", P([1])),
    ("array [nil]", P([None])),
    ("map empty", P({})),
    ("map {a:1}", P({"a": 1})),
    ("ext 5", P(msgspec.msgpack.Ext(5, b"ab"))),
    ("timestamp32", b"\xd6\xff\x00\x00\x00\x01"),
]


def _stored(**over: bytes | None) -> list[tuple[bytes, bytes]]:
    """A BlockStored's pairs; a field given as None is left out."""
    fields = {
        "type": P("BlockStored"),
        "block_hashes": P([1, b"\xaa"]),
        "parent_block_hash": P(None),
        "token_ids": P([1, 2]),
        "block_size": P(16),
        "lora_id": P(None),
        "medium": P("CPU"),
        "lora_name": P(None),
    }
    fields.update(over)
    return [(_k(k), v) for k, v in fields.items() if v is not None]


def _removed(**over: bytes | None) -> list[tuple[bytes, bytes]]:
    fields = {"type": P("BlockRemoved"), "block_hashes": P([5]), "medium": P("CPU")}
    fields.update(over)
    return [(_k(k), v) for k, v in fields.items() if v is not None]


FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
          "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
          "kv_cache_spec_sliding_window", "locality", "ownership", "session_id",
          "lookahead_token_ids"]


REMOVED_FIELDS = ["block_hashes", "medium", "group_idx", "locality", "ownership"]


def _batch(*events: bytes, ts: bytes = P(1.5), rest: list[bytes] | None = None) -> bytes:
    return _arr([ts, _arr(list(events))] + ([P(0)] if rest is None else rest))


def _ek(*items: bytes) -> bytes:
    """A batch whose one BlockStored has extra_keys [(items...)]."""
    return _batch(_map(_stored(extra_keys=_arr([_arr(list(items))]))))


def _ts64(secs: int, nanos: int) -> bytes:
    return b"\xd7\xff" + struct.pack(">Q", (nanos << 34) | secs)


def _ts96(secs: int, nanos: int) -> bytes:
    return b"\xc7\x0c\xff" + struct.pack(">Iq", nanos, secs)


def _corpus() -> list[tuple[str, bytes]]:
    c: list[tuple[str, bytes]] = []
    add = lambda name, payload: c.append((name, payload))  # noqa: E731
    stored, removed, cleared = _map(_stored()), _map(_removed()), P({"type": "AllBlocksCleared"})
    every = _map(_stored(
        block_hashes=P([0, 2**64 - 1, -1, -(2**63), b"", bytes(range(32))]),
        parent_block_hash=P(-5), token_ids=P([-1, 2**64 - 1, 0]), block_size=P(-16),
        lora_id=P(2**64 - 1), lora_name=P("adapter"),
        extra_keys=P([("adapter", "img", 0), None, (1.5, b"x", [1, [2]], {"k": None})]),
        group_idx=P(-(2**63)), kv_cache_spec_kind=P("full_attention"),
        kv_cache_spec_sliding_window=P(2**63), locality=P("LOCAL"), ownership=P("tier2"),
        session_id=P("s1"), lookahead_token_ids=P([[1, -2], []]),
    ))
    add("every field at its edges", _batch(every, removed, cleared, rest=[P(2**64 - 1)]))

    # The batch's shape.
    for name, v in [("map", P({"ts": 1.5, "events": []})), ("int", P(1)), ("nil", P(None)),
                    ("str", P("x")), ("bin", P(b"x")), ("empty array", P([]))]:
        add(f"batch is {name}", v)
    add("batch of 1 item", _arr([P(1.5)]))
    add("batch of 2 items", _arr([P(1.5), P([])]))
    for n in range(3, 7):
        extra = [P("x"), b"\xa1\xff", b"\xd6\xff\xff\xff", _arr([P({1: [None]})])][: n - 3]
        add(f"batch of {n} items", _batch(stored, rest=[P(3)] + extra))
    add("batch as array16", b"\xdc\x00\x03" + P(1.5) + P([]) + P(None))
    add("batch as array32", b"\xdd\x00\x00\x00\x02" + P(1.5) + P([]))
    add("4th item malformed", _batch(rest=[P(0), b"\xc1"]))
    add("4th item cut short", _batch(rest=[P(0), b"\xa5ab"]))
    for name, v in VALUES:
        add(f"ts {name}", _batch(ts=v))
        add(f"rank {name}", _batch(rest=[v]))
        add(f"events {name}", _arr([P(1.5), v]))
        add(f"event {name}", _batch(v))

    # Each field of each kind: every value, left out, given twice.
    kinds = {"BlockStored": _stored, "BlockRemoved": _removed}
    for kind, make in kinds.items():
        names = [f for f in FIELDS if kind == "BlockStored" or f in REMOVED_FIELDS]
        for field in names:
            if field == "type":
                continue
            for name, v in VALUES:
                add(f"{kind}.{field} = {name}", _batch(_map(make(**{field: v}))))
                if field in ("block_hashes", "token_ids", "lookahead_token_ids", "extra_keys"):
                    add(f"{kind}.{field} = [{name}]", _batch(_map(make(**{field: _arr([v])}))))
            add(f"{kind}.{field} left out", _batch(_map(make(**{field: None}))))
            good = dict(make())[_k(field)] if _k(field) in dict(make()) else P(None)
            add(f"{kind}.{field} twice, then nil",
                _batch(_map(make() + [(_k(field), good), (_k(field), P(None))])))
            add(f"{kind}.{field} twice, then a float",
                _batch(_map(make() + [(_k(field), good), (_k(field), P(2.5))])))
            add(f"{kind}.{field} twice, first a float",
                _batch(_map([(_k(field), P(2.5))] + make())))
        add(f"{kind}.lookahead_token_ids = [[big ints]]",
            _batch(_map(make(lookahead_token_ids=P([[2**64 - 1, -(2**63)], [0]])))))

    # The tag.
    for name, tag in [("unknown", P("Foo")), ("lower case", P("blockstored")), ("int", P(1)),
                      ("nil", P(None)), ("bin", P(b"BlockStored")),
                      ("not utf-8", b"\xa2\xff\xfe"), ("str8", b"\xd9\x0cBlockRemoved")]:
        add(f"type {name}", _batch(_map(_removed(type=tag))))
    add("type missing", _batch(_map(_removed(type=None))))
    add("type last", _batch(_map(_removed(type=None) + [(_k("type"), P("BlockRemoved"))])))
    add("type twice, the same", _batch(_map(_removed() + [(_k("type"), P("BlockRemoved"))])))
    add("type twice, another tag",
        _batch(_map(_removed() + [(_k("type"), P("AllBlocksCleared"))])))
    add("type twice, an int", _batch(_map(_removed() + [(_k("type"), P(1))])))
    add("type twice, unknown", _batch(_map(_removed() + [(_k("type"), P("Foo"))])))
    add("type twice, first unknown", _batch(_map([(_k("type"), P("Foo"))] + _removed())))
    add("cleared with fields", _batch(_map([(_k("type"), P("AllBlocksCleared")),
                                            (_k("medium"), P(5)), (_k("block_size"), P("x"))])))
    add("cleared as map32", _batch(b"\xdf\x00\x00\x00\x01" + _k("type") + P("AllBlocksCleared")))
    add("removed with BlockStored's fields", _batch(_map(_removed(block_size=P("x")))))

    # Keys.
    for name, key in [("int", P(1)), ("nil", P(None)), ("bin", P(b"medium")),
                      ("float", P(1.5)), ("array", P([])), ("not utf-8", b"\xa2\xff\xfe"),
                      ("str8 known", b"\xd9\x06medium"), ("str16 unknown", b"\xda\x00\x01z")]:
        add(f"key {name}", _batch(_map(_removed() + [(key, P(7))])))
    for name, v in VALUES + [("malformed", b"\xc1"), ("deep 100", b"\x91" * 100 + P(0)),
                             ("bad timestamp", b"\xd5\xff\x00\x00"),
                             ("map with a map key", b"\x81\x80\x00")]:
        add(f"unknown key = {name}", _batch(_map(_removed() + [(_k("zz"), v)])))
    add("unknown key twice", _batch(_map(_removed() + [(_k("zz"), P(1)), (_k("zz"), P("x"))])))

    # extra_keys' items: any value as msgspec reads one into Python.
    for name, v in VALUES:
        add(f"extra_keys item {name}", _ek(v))
        add(f"extra_keys map key {name}", _ek(_map([(v, P(1))])))
    add("extra_keys nil item", _batch(_map(_stored(extra_keys=P([None, ("a",)])))))
    add("extra_keys map with a map key", _ek(b"\x81\x80\x02"))
    add("extra_keys map with an array key holding a map", _ek(b"\x81\x91\x80\x02"))
    add("extra_keys map with an array key", _ek(b"\x81\x92\x01\xa1a\x02"))
    for name, pairs in [("1 and 1", [P(1), P(1)]), ("1 and 1.0", [P(1), P(1.0)]),
                        ("true and 1", [P(True), P(1)]), ("0 and false", [P(0), P(False)]),
                        ("0.0 and -0.0", [P(0.0), P(-0.0)]), ("'a' and b'a'", [P("a"), P(b"a")]),
                        ("[1] and [1.0]", [P([1]), P([1.0])]),
                        ("nan and nan", [P(float("nan"))] * 2),
                        ("nil and nil", [P(None), P(None)]), ("2**64-1 twice", [P(2**64 - 1)] * 2),
                        ("ext and ext", [P(msgspec.msgpack.Ext(1, b"a"))] * 2)]:
        add(f"extra_keys map keys {name}",
            _ek(_map([(pairs[0], P("first")), (P("mid"), P(0)), (pairs[1], P("last"))])))
    for name, ts in [("32", b"\xd6\xff\xff\xff\xff\xff"), ("64 whole", _ts64(5, 0)),
                     ("64 nanos", _ts64(5, 1500)), ("64 max nanos", _ts64(2**34 - 1, 999_999_999)),
                     ("64 nanos too big", _ts64(1, 1_000_000_000)), ("96 negative", _ts96(-1, 0)),
                     ("96 min", _ts96(-62_135_596_800, 0)),
                     ("96 min - 1", _ts96(-62_135_596_801, 999_999_999)),
                     ("96 max", _ts96(253_402_300_799, 999_999_999)),
                     ("96 max + 1", _ts96(253_402_300_800, 0)), ("96 small", _ts96(7, 3000)),
                     ("96 nanos too big", _ts96(0, 10**9)), ("len 0", b"\xc7\x00\xff"),
                     ("len 3", b"\xc7\x03\xff\x00\x00\x00"), ("len 16", b"\xd8\xff" + bytes(16)),
                     ("len 2", b"\xd5\xff\x00\x00")]:
        add(f"extra_keys timestamp {name}", _ek(ts))
    for name, ext in [("len 0", b"\xc7\x00\x05"), ("len 3", b"\xc7\x03\x05abc"),
                      ("len 16", b"\xd8\x7f" + bytes(16)), ("code -128", b"\xd4\x80\x01"),
                      ("ext16", b"\xc8\x00\x02\x05ab"), ("ext32", b"\xc9\x00\x00\x00\x01\x05a")]:
        add(f"extra_keys ext {name}", _ek(ext))

    # Nesting (vLLM's limit is the interpreter's recursion limit: depths well inside and well
    # past it), cut-short input, trailing bytes, huge length claims, the reserved byte.
    for d in (10, 100, 400):
        add(f"extra_keys nested {d}", _ek(b"\x91" * d + P(1)))
        add(f"4th item nested {d}", _batch(rest=[P(0), b"\x91" * d + P(1)]))
    for d in (3000, 5000):
        add(f"extra_keys nested {d}", _ek(b"\x91" * d + P(1)))
        add(f"4th item nested {d}", _batch(rest=[P(0), b"\x91" * d + P(1)]))
        add(f"batch nested {d}", b"\x91" * d + P(1))
    whole = _batch(every, removed, cleared)
    for cut in sorted({0, 1, 2, 5, 9, 10, 11, 20, 40, 80, len(whole) // 2, len(whole) - 1}):
        add(f"cut at {cut}", whole[:cut])
    add("trailing nil", whole + P(None))
    add("trailing batch", whole + whole)
    for name, head in [("array32", b"\xdd"), ("map32", b"\xdf"), ("str32", b"\xdb"),
                       ("bin32", b"\xc6")]:
        add(f"events claim a 4G {name}", _arr([P(1.5), head + b"\xff\xff\xff\xff"]))
    add("extra_keys claim a 4G ext32", _ek(b"\xc9\xff\xff\xff\xff\x05"))
    add("event claims a 4G map",
        _batch(b"\xdf\xff\xff\xff\xff" + _k("type") + P("AllBlocksCleared")))
    add("reserved byte as ts", _batch(ts=b"\xc1"))
    return c


def _vllm(payload: bytes) -> tuple[str, str]:
    decoder = msgspec.msgpack.Decoder(type=ke.KVEventBatch)
    try:
        batch = decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return "reject", "-"
    return "accept", msgspec.msgpack.encode(batch).hex()


def _render() -> str:
    lines = [
        "# KV-events payloads and vLLM 0.33.0's decoder's answers (msgspec.msgpack.Decoder of",
        "# KVEventBatch): name, accept|reject, payload hex, the decoded batch re-encoded (hex).",
        "# Written by std-adapter/python/tests/test_kv_events_decoder.py.",
    ]
    names = set()
    for name, payload in _corpus():
        assert name not in names and "\t" not in name, name
        names.add(name)
        verdict, again = _vllm(payload)
        lines.append(f"{name}\t{verdict}\t{payload.hex()}\t{again}")
    return "\n".join(lines) + "\n"


def test_corpus_is_what_vllm_answers():
    want = _render()
    if os.environ.get("KVTIER_REGEN_CORPUS") == "1":
        CORPUS.write_text(want)
    have = CORPUS.read_text()
    assert have == want, "the corpus differs from vLLM's answers: KVTIER_REGEN_CORPUS=1 rewrites it"
    rows = [line.split("\t") for line in want.splitlines() if not line.startswith("#")]
    accepted = sum(r[1] == "accept" for r in rows)
    # The corpus exercises both answers in bulk.
    assert accepted > 200 and len(rows) - accepted > 200, (accepted, len(rows))


def test_vllm_decoder_is_the_subscribers():
    """The decoder above is the one vLLM's own code paths build for the stream (msgspec's
    typed decoder of KVEventBatch): a batch vLLM encodes comes back equal."""
    b = ke.KVEventBatch(ts=1.0, events=[ke.AllBlocksCleared()], data_parallel_rank=1)
    assert msgspec.msgpack.Decoder(type=ke.KVEventBatch).decode(msgspec.msgpack.encode(b)) == b


def _plain(v) -> bool:
    """Whether `kvtier events`' JSON shows `v` as msgspec's builtins do: no extension or
    timestamp (hex there, objects here), no map key but text, no infinite float."""
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    return v is None or isinstance(v, (bool, int, str, bytes))


def test_kvtier_events_prints_vllms_values_and_stops_at_a_rejected_payload(kvtier_bin):
    decoder = msgspec.msgpack.Decoder(type=ke.KVEventBatch)
    rows = [line.split("\t") for line in CORPUS.read_text().splitlines()
            if not line.startswith("#")]
    sent, want = [], []
    for name, verdict, payload, _ in rows:
        if verdict != "accept" or "nested" in name:  # (deeper than a JSON reader goes)
            continue
        try:
            builtins = msgspec.to_builtins(decoder.decode(bytes.fromhex(payload)),
                                           builtin_types=(bytes, datetime.datetime))
        except TypeError:  # an extension value: no builtin form
            continue
        if _plain(builtins):
            sent.append(bytes.fromhex(payload))
            want.append((name, _hexed(builtins)))
    assert len(sent) > 400
    rejected = next(bytes.fromhex(r[2]) for r in rows
                    if r[0] == "BlockStored.block_size = float 16.0")
    events = subprocess.Popen(
        [kvtier_bin, "events", "--bind", "--endpoint", "tcp://127.0.0.1:0",
         "--count", str(len(sent) + 1)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    ctx = zmq.Context()
    try:
        bound = re.search(r"bound (tcp://\S+)", events.stderr.readline()).group(1)
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 0)
        pub.connect(bound)
        time.sleep(1.0)  # the connection and the subscription, before the first message
        for seq, payload in enumerate(sent + [rejected]):
            pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
        out, err = events.communicate(timeout=60)
    finally:
        if events.poll() is None:
            events.kill()
        ctx.destroy(linger=0)
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == len(sent)
    for line, (name, batch) in zip(lines, want):
        assert line["batch"] == batch, name
    assert events.returncode != 0
    assert "`block_size` takes int, not float" in err, err
