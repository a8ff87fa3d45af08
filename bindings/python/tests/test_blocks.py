"""The token path of a block (kvtier computes its hash), CUDA-event fences, and the typed codes
and records the binding returns."""
import dataclasses

import pytest

from test_kvtier import manager, stored  # also puts the package on sys.path
import kvtier  # noqa: E402

State = kvtier.BlockState


def test_token_path_walks_every_state_and_hashes_as_hash_sequence():
    salt = kvtier.hash_salt(b"token-path")
    tokens = list(range(100, 108))
    want = kvtier.hash_sequence(tokens, 4, salt)
    with manager() as m:
        b0, b1 = m.alloc(2)
        assert m.block_info(b0).state == State.EMPTY
        m.block_init(b0, salt)
        assert m.block_info(b0).state == State.PARTIAL
        m.block_append(b0, tokens[:3])
        assert (m.block_info(b0).state, m.block_info(b0).tokens) == (State.READY, 3)
        m.block_unschedule(b0)
        assert (m.block_info(b0).state, m.block_info(b0).tokens) == (State.PARTIAL, 3)
        m.block_append(b0, tokens[3:4])
        m.block_schedule(b0)
        assert m.block_info(b0).state == State.INFLIGHT
        m.block_compute_done(b0)
        assert m.block_info(b0).state == State.COMPLETE
        r0 = m.block_register(b0)
        info = m.block_info(r0)
        assert (info.state, info.seq_hash, info.parent_hash) == (State.REGISTERED, want[0], 0)

        m.block_init(b1, b"token-path", parent=want[0])  # the salt itself works too
        m.block_append(b1, tokens[4:6])
        m.block_schedule(b1)
        m.block_compute_done(b1)  # not full: back to PARTIAL, tokens kept
        assert (m.block_info(b1).state, m.block_info(b1).tokens) == (State.PARTIAL, 2)
        m.block_append(b1, tokens[6:8])
        with pytest.raises(kvtier.InvalidArgumentError):
            m.block_append(b1, [1])  # no room left
        m.block_schedule(b1)
        m.block_compute_done(b1)
        r1 = m.block_register(b1)
        assert (m.block_info(r1).seq_hash, m.block_info(r1).parent_hash) == (want[1], want[0])
        with pytest.raises(kvtier.StateError):
            m.block_schedule(r1)  # registered blocks are immutable
        got = m.match_prefix(want)
        assert got == [r0, r1]

        (dup,) = m.alloc(1)  # the same tokens again: deduplicated onto r0
        m.block_init(dup, salt)
        m.block_append(dup, tokens[:4])
        m.block_schedule(dup)
        m.block_compute_done(dup)
        assert m.block_register(dup) == r0
        assert m.block_info(r0).refs == 3
        m.release(got + [r0, r0, r1])
        m.check()


def test_note_tokens_checks_its_lengths():
    with manager() as m:  # no publisher: a no-op that still checks its input
        hashes = kvtier.hash_sequence(range(8), 4)
        m.note_tokens(hashes, list(range(8)))
        with pytest.raises(kvtier.InvalidArgumentError, match="7 tokens for 2 blocks of 4"):
            m.note_tokens(hashes, list(range(7)))


def test_a_cuda_event_fence_is_refused_without_cuda_or_waits_for_its_event():
    with manager() as m:
        with pytest.raises(kvtier.InvalidArgumentError, match="cuda_event"):
            m.fence_from_cuda_event(0)
        try:
            # Never queried: no transfer waits on it, and the library only borrows it.
            f = m.fence_from_cuda_event(0xDEAD0)
        except kvtier.UnsupportedError as e:
            assert "without CUDA" in e.message
            return
        with f, pytest.raises(kvtier.StateError, match="signalled by its event"):
            f.signal()


def test_codes_are_int_enums_equal_to_the_old_ints():
    assert kvtier.G2 is kvtier.Tier.G2 and kvtier.G2 == 2 and kvtier.Tier(4) is kvtier.G4
    assert kvtier.SLOT_DECODING is kvtier.SlotState.DECODING
    assert kvtier.XFER_DONE is kvtier.EventType.XFER_DONE
    for state in kvtier.SlotState:
        assert kvtier.slot_state_str(state) == "KVT_SLOT_" + state.name
    for state in kvtier.CandidateState:
        assert kvtier.candidate_state_str(state) == state.name
    for trigger in kvtier.ObsTrigger:
        assert kvtier.obs_trigger_str(trigger) == trigger.name
    for kind in kvtier.ObsKind:
        assert kvtier.obs_kind_str(kind.code) == kind == kind.name
    assert kvtier.candidate_state_str(99) == kvtier.obs_trigger_str(99) == "UNKNOWN"


def test_results_are_dataclasses_that_read_like_dicts():
    with manager(min_batch_size=1) as m:
        a = stored(m, [5])
        info = m.block_info(a[0])
        assert dataclasses.is_dataclass(info) and info["seq_hash"] == info.seq_hash == 5
        assert info.state is kvtier.BlockState.REGISTERED and info.tier is kvtier.G1
        assert dict(info) == dataclasses.asdict(info) and "refs" in info and len(info) == 6
        with pytest.raises(KeyError):
            info["no_such_field"]
        with pytest.raises(dataclasses.FrozenInstanceError):
            info.refs = 9
        (e,) = m.poll()
        assert e.type is kvtier.EventType.BLOCK_STORED and e.tier is kvtier.G1 and e.hash == 5
        with m.offload(a, kvtier.G2) as x:
            x.wait(10)
            assert x.state is kvtier.XferState.DONE
        m.release(a)
