"""The whole kvt_manager_config from Python: engine-owned G1 memory in any buffer, policies,
G3's I/O engine and fault injection."""
import array
import dataclasses
import gc
import mmap
import weakref

import pytest

from test_kvtier import manager, stored  # also puts the package on sys.path
import kvtier  # noqa: E402

CHUNK, SLOTS = 64, 4


class Buffer(bytearray):
    """A bytearray that can be watched with a weak reference."""


def engine_buffers(strides):
    """The engine's own KV memory for 2 layers x K/V, one kind of buffer per pair."""
    size = [(SLOTS - 1) * s + CHUNK for s in strides]
    raw = array.array("B", bytes(size[3]))
    return [bytearray(size[0]), memoryview(bytearray(size[1])),
            mmap.mmap(-1, size[2]), raw], raw


def test_engine_owned_host_g1_round_trip_through_g2():
    strides = [CHUNK, 2 * CHUNK, 3 * CHUNK, CHUNK + 16]
    bufs, raw = engine_buffers(strides)
    address, _ = raw.buffer_info()
    bases = bufs[:3] + [(address, len(raw))]  # the last one as a raw address and length
    layout = kvtier.G1Layout(bases, strides)
    views = [memoryview(b).cast("B") for b in bufs]
    base_addr = [kvtier.ffi.cast("uintptr_t", kvtier.ffi.from_buffer(b)) for b in bufs]

    def slot_of(m, block):
        """The slot that holds a G1 block, from where its chunks lie in the engine's buffers."""
        slots = set()
        for i in range(4):
            off = m.block_chunk(block, i // 2, i % 2) - int(base_addr[i])
            assert off % strides[i] == 0 and 0 <= off // strides[i] < SLOTS
            slots.add(off // strides[i])
        assert len(slots) == 1
        return slots.pop()

    def chunk(i, slot):
        return views[i][slot * strides[i]:slot * strides[i] + CHUNK]

    with kvtier.Manager(g1_layout=layout, page_size=4, num_layers=2, num_outer=2,
                        chunk_bytes=CHUNK, g1_blocks=SLOTS, g2_blocks=8, min_batch_size=1) as m:
        (a,) = m.alloc(1)
        s = slot_of(m, a)
        for i in range(4):  # the engine writes its KV bytes into its own tensors
            chunk(i, s)[:] = bytes((17 * i + j) & 0xFF for j in range(CHUNK))
        want = [bytes(chunk(i, s)) for i in range(4)]
        (a,) = m.register_hashes([a], [500])
        with m.offload([a], kvtier.G2) as x:
            assert x.wait(10) == 1
        m.release([a])
        held = m.alloc(SLOTS)  # evicts block 500 from G1
        assert m.match_prefix([500]) == []
        keep = [b for b in held if slot_of(m, b) == s]
        m.release([b for b in held if b not in keep])  # slot s stays taken
        for i in range(4):
            chunk(i, s)[:] = bytes(CHUNK)
        src = m.match_prefix([500], kvtier.G2)
        dst = m.alloc(1)
        with m.onboard(src, dst) as x:
            assert x.wait(10) == 1
            (final,) = x.blocks()
        t = slot_of(m, final)
        assert t != s
        assert [bytes(chunk(i, t)) for i in range(4)] == want  # read from the engine's memory
        assert all(bytes(chunk(i, s)) == bytes(CHUNK) for i in range(4))
        m.release(src + [final] + keep)
        m.check()


def test_the_manager_keeps_g1_buffers_alive_until_it_closes():
    buf = Buffer(SLOTS * CHUNK)
    watch = weakref.ref(buf)
    m = kvtier.Manager(g1_layout=kvtier.G1Layout([buf], [CHUNK]), num_layers=1, num_outer=1,
                       chunk_bytes=CHUNK, g1_blocks=SLOTS, g2_blocks=0)
    del buf
    gc.collect()
    assert watch() is not None
    a = stored(m, [1], fill=0x33)  # block_data points into the engine's buffer
    assert bytes(watch()).count(0x33) == CHUNK
    m.release(a)
    m.close()
    gc.collect()
    assert watch() is None


def test_bad_g1_layouts_are_refused_before_the_library_sees_them():
    cfg = dict(num_layers=1, num_outer=2, chunk_bytes=CHUNK, g1_blocks=SLOTS, g2_blocks=0)
    good = bytearray(SLOTS * CHUNK)
    for bases, why in (([good, bytearray(SLOTS * CHUNK - 1)], "bytes"),
                       ([good, bytes(SLOTS * CHUNK)], "base 1"),
                       ([good], "bases")):
        with pytest.raises(kvtier.InvalidArgumentError) as e:
            kvtier.Manager(g1_layout=kvtier.G1Layout(bases, [CHUNK] * len(bases)), **cfg)
        assert why in e.value.message
    with pytest.raises(kvtier.InvalidArgumentError) as e:  # the library's own check
        kvtier.Manager(g1_layout=kvtier.G1Layout([good, good], [CHUNK - 1, CHUNK]), **cfg)
    assert "stride" in e.value.message


def test_every_config_field_is_accepted_by_name():
    fields = {name for name, _ in kvtier.ffi.typeof("kvt_manager_config").fields}
    assert fields - {"struct_size", "g3_path", "g1_layout"} <= kvtier._CONFIG_FIELDS
    for name in ("g3_io", "cuda_copy", "policy_g2_g3", "g3_fault_op", "copy_threads"):
        assert name in fields
    with pytest.raises(kvtier.InvalidArgumentError):
        manager(no_such_field=1)
    with pytest.raises(kvtier.InvalidArgumentError):
        manager(policy_g1_g2="presence")
    with pytest.raises(kvtier.InvalidArgumentError):
        manager(struct_size=8)


def test_a_frequency_policy_offloads_on_the_second_offer():
    with manager(policy_g1_g2=kvtier.Policy(kvtier.POLICY_FREQUENCY, 2),
                 max_concurrent_transfers=2, copy_threads=2, cuda_copy=kvtier.CUDA_COPY_PER_CHUNK,
                 flush_interval_us=1000, policy_timeout_us=50000, sweep_interval_us=5000) as m:
        a = stored(m, [600])
        with m.offload(a, kvtier.G2) as x:
            assert x.wait(10) == 0  # offered once: filtered out
        with m.offload(a, kvtier.G2) as x:
            assert x.wait(10) == 1
        m.release(a)
    with manager(policy_g1_g2={"flags": kvtier.POLICY_PRESENCE}) as m:
        assert not m.closed


def test_g3_fault_fields_fail_one_write_then_let_the_rest_through(tmp_path):
    with manager(g3_path=str(tmp_path), g3_blocks=8, g2_blocks=0, g3_io=kvtier.IO_THREADS,
                 g3_fault_op=kvtier.G3_FAULT_WRITE, g3_fault_errno=5, g3_fault_skip=0,
                 g3_fault_count=1,
                 # No presence filter: a failed offload's "on its way" mark may outlive its wait.
                 policy_g1_g3=kvtier.Policy(kvtier.POLICY_PASS_ALL)) as m:
        a = stored(m, [700])
        with m.offload(a, kvtier.G3) as x:
            with pytest.raises(kvtier.IoError) as e:
                x.wait(10)
        assert "Input/output error" in e.value.message
        with m.offload(a, kvtier.G3) as x:
            assert x.wait(10) == 1
        assert m.transfer_stats(kvtier.G1, kvtier.G3)["failed"] == 1
        m.release(a)


def test_stats_carry_every_field_of_the_struct():
    with manager() as m:
        s = m.tier_stats(kvtier.G1)
        assert "retired" in s and s["retired"] == 0
        assert s["free"] + s["active"] + s["inactive"] + s["retired"] == s["capacity"]
        t = m.transfer_stats(kvtier.G1, kvtier.G2)
        assert set(t) == {"completed", "cancelled", "failed", "blocks", "bytes", "busy_ns"}


C_DEFAULTS = {kvtier.ManagerConfig: "kvt_manager_config",
              kvtier.ConnectorConfig: "kvt_connector_config",
              kvtier.EndpointConfig: "kvt_endpoint_config"}


@pytest.mark.parametrize("cls", list(C_DEFAULTS), ids=lambda c: c.__name__)
def test_config_dataclasses_name_every_field_with_the_librarys_defaults(cls):
    ffi, ctype = kvtier.ffi, C_DEFAULTS[cls]
    c = ffi.new(ctype + " *")
    getattr(kvtier.C, ctype + "_init_sized")(c, ffi.sizeof(ctype))
    settable = [n for n, _ in ffi.typeof(ctype).fields
                if n != "struct_size" and not n.startswith("reserved")]
    assert [f.name for f in dataclasses.fields(cls)] == settable
    for name, value in dataclasses.asdict(cls()).items():
        want = getattr(c, name)
        if isinstance(want, ffi.CData) and ffi.typeof(want).kind == "pointer":
            want = None if want == ffi.NULL else want
        elif isinstance(want, ffi.CData) and ffi.typeof(want).kind == "array":
            want, value = list(want), list(value)
        elif isinstance(want, ffi.CData):  # a kvt_policy
            want = kvtier.Policy(want.flags, want.min_frequency)
        if name == "g1_memory":  # the binding's one departure: host memory
            assert (value, want) == (kvtier.MEMORY_HOST, kvtier.MEMORY_AUTO)
            continue
        assert value == want, name


def test_a_manager_config_object_and_fields_over_it():
    cfg = kvtier.ManagerConfig(page_size=4, g1_blocks=8, g2_blocks=0, chunk_bytes=16)
    with kvtier.Manager(cfg, g1_blocks=5) as m:
        assert m.tier_stats(kvtier.G1).capacity == 5 and m.tier_stats(kvtier.G2).capacity == 0
        assert m.tier_stats(kvtier.G1).block_bytes == 2 * 16
    assert cfg.g1_blocks == 8  # the caller's object is not changed
    with pytest.raises(kvtier.InvalidArgumentError, match="must be a kvtier.ManagerConfig"):
        kvtier.Manager({"page_size": 4})
    with pytest.raises(kvtier.InvalidArgumentError, match="g3_path"):
        kvtier.Manager(cfg, g3_path=12)


# Each field reaches the library: a value it refuses comes back naming the field.
REFUSED = [("event_capacity", 0), ("max_batch_size", 0), ("min_batch_size", 100),
           ("flush_interval_us", 10**13), ("policy_timeout_us", 0), ("sweep_interval_us", 0),
           ("max_concurrent_transfers", 0), ("copy_threads", 65),
           ("policy_g1_g3", (kvtier.POLICY_FREQUENCY, 0)),
           ("policy_g2_g3", (kvtier.POLICY_FREQUENCY, 0)), ("cuda_copy", 9),
           ("g3_fault_op", 7), ("g3_fault_errno", 5), ("g3_fault_skip", 1),
           ("g3_fault_count", 1), ("g3_on_mismatch", 5), ("kv_events_buffer", 0),
           ("kv_events_dp_rank", -1), ("kv_events_tiers", 1 << 9), ("kv_events_format", 9),
           ("g4_timeout_us", 0), ("g4_url", "http://x"), ("g4_password_env", "KVT_TEST_UNSET"),
           ("g4_key_prefix", "a b"), ("g4_key_env", "KVT_TEST_UNSET"),
           ("g3_key_env", "KVT_TEST_UNSET"), ("kv_events_endpoint", "bogus://x"),
           ("kv_events_replay_endpoint", "ipc:///nonexistent/r")]


@pytest.mark.parametrize("field,value", REFUSED, ids=[f for f, _ in REFUSED])
def test_each_manager_field_reaches_the_library(field, value, monkeypatch):
    monkeypatch.delenv("KVT_TEST_UNSET", raising=False)
    extra = {"g4_url": "unix:///nonexistent/r.sock"} if field.startswith("g4_") else {}
    if field == "g3_key_env":
        extra = {"g3_blocks": 4}
    if field == "g4_url":
        extra = {}
    with pytest.raises(kvtier.InvalidArgumentError) as e:
        manager(**dict(extra, **{field: value}))
    assert field in e.value.message


def test_g3_key_env_macs_the_slots(tmp_path, monkeypatch):
    """A persistent G3 written under one key is read back under it, and under another key
    every slot fails its MAC: never served."""
    monkeypatch.setenv("KVT_TEST_G3_KEY", "11" * 32)
    cfg = dict(g3_path=str(tmp_path), g3_blocks=4, g2_blocks=0, g3_persist=True,
               g3_namespace=9, g3_key_env="KVT_TEST_G3_KEY", min_batch_size=1)
    with manager(**cfg) as m:
        a = stored(m, [800], fill=0x42)
        with m.offload(a, kvtier.G3) as x:
            assert x.wait(10) == 1
        m.release(a)
    with manager(**cfg) as m:
        assert m.tier_stats(kvtier.G3).recovered == 1
        (src,) = m.match_prefix([800], kvtier.G3)
        dst = m.alloc(1)
        with m.onboard([src], dst) as x:
            assert x.wait(10) == 1
            (b,) = x.blocks()
        assert bytes(m.block_data(b)) == b"\x42" * len(m.block_data(b))
        m.release([src, b])
    monkeypatch.setenv("KVT_TEST_G3_KEY", "22" * 32)
    with manager(**cfg) as m:
        srcs = m.match_prefix([800], kvtier.G3)  # recovery reads headers, not the MAC
        dst = m.alloc(1)
        with m.onboard(srcs, dst) as x, pytest.raises(kvtier.CorruptError):
            x.wait(10)
        m.release(srcs + dst)
        assert m.match_prefix([800], kvtier.G3) == []
