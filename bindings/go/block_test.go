package kvtier_test

import (
	"context"
	"errors"
	"reflect"
	"sort"
	"testing"
	"time"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

func info(t *testing.T, m *kvtier.Manager, b kvtier.Block) kvtier.BlockInfo {
	t.Helper()
	i, err := m.BlockInfo(b)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The token path: two blocks of a sequence walk Partial, Ready, Inflight and Complete, and
// register under the hashes HashSequence gives for their tokens.
func TestTokenPathRegistersUnderTheSequenceHashes(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	salt := kvtier.HashSalt([]byte("token path"))
	tokens := []uint32{11, 12, 13, 14, 15, 16, 17, 18}
	want, err := kvtier.HashSequence(tokens, 4, salt)
	must(t, err)
	b, err := m.Alloc(2, kvtier.G1)
	must(t, err)
	expect := func(x kvtier.Block, state kvtier.BlockState, tokens uint32) {
		t.Helper()
		if i := info(t, m, x); i.State != state || i.Tokens != tokens || i.Tier != kvtier.G1 || i.Refs != 1 {
			t.Fatalf("block %x: %+v, want state %d with %d tokens", x, i, state, tokens)
		}
	}
	expect(b[0], kvtier.BlockEmpty, 0)
	must(t, m.InitBlock(b[0], salt, 0))
	expect(b[0], kvtier.BlockPartial, 0)
	must(t, m.AppendTokens(b[0], tokens[:3]))
	expect(b[0], kvtier.BlockReady, 3)
	must(t, m.Unschedule(b[0]))
	expect(b[0], kvtier.BlockPartial, 3)
	if err := m.Schedule(b[0]); !errors.Is(err, kvtier.ErrState) {
		t.Fatalf("scheduling a Partial block: %v", err)
	}
	must(t, m.AppendTokens(b[0], tokens[3:4]))
	if err := m.AppendTokens(b[0], tokens[4:5]); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("a fifth token in a block of 4: %v", err)
	}
	must(t, m.Schedule(b[0]))
	expect(b[0], kvtier.BlockInflight, 4)
	must(t, m.ComputeDone(b[0]))
	expect(b[0], kvtier.BlockComplete, 4)
	r0, err := m.Register(b[0])
	must(t, err)
	if i := info(t, m, r0); r0 != b[0] || i.State != kvtier.BlockRegistered || i.SeqHash != want[0] || i.Parent != 0 {
		t.Fatalf("first block registered as %x: %+v, want hash %x", r0, i, want[0])
	}

	must(t, m.InitBlock(b[1], salt, want[0]))
	must(t, m.AppendTokens(b[1], tokens[4:6]))
	must(t, m.Schedule(b[1]))
	must(t, m.ComputeDone(b[1])) // half full: Partial again
	expect(b[1], kvtier.BlockPartial, 2)
	must(t, m.AppendTokens(b[1], tokens[6:]))
	must(t, m.Schedule(b[1]))
	must(t, m.ComputeDone(b[1]))
	r1, err := m.Register(b[1])
	must(t, err)
	if i := info(t, m, r1); i.SeqHash != want[1] || i.Parent != want[0] {
		t.Fatalf("second block: %+v, want hash %x parent %x", i, want[1], want[0])
	}
	got, err := m.MatchPrefix(want, kvtier.G1)
	must(t, err)
	if !reflect.DeepEqual(got, []kvtier.Block{r0, r1}) {
		t.Fatalf("match %v, want %v", got, []kvtier.Block{r0, r1})
	}
	must(t, m.Release(append(got, r0, r1)))
	must(t, m.Check())
}

// RegisterHash deduplicates; Retain adds a reference; priorities and pins decide what
// Evictable lists and what an allocation evicts; MaxPinnedPercent bounds the pins.
func TestRegisterHashRetainPinPriorityAndEvictable(t *testing.T) {
	cfg := testConfig()
	cfg.G1Blocks, cfg.MaxPinnedPercent = 4, 25 // one pinned block at most
	m, err := kvtier.NewManager(cfg)
	must(t, err)
	defer m.Close()
	b, err := m.Alloc(3, kvtier.G1)
	must(t, err)
	r, parents := make([]kvtier.Block, 3), []uint64{0, 100, 101}
	for i := range b {
		r[i], err = m.RegisterHash(b[i], uint64(100+i), parents[i])
		must(t, err)
		if r[i] != b[i] {
			t.Fatalf("a new hash registered as %x, not %x", r[i], b[i])
		}
	}
	x, err := m.Alloc(1, kvtier.G1)
	must(t, err)
	d, err := m.RegisterHash(x[0], 100, 0)
	must(t, err)
	if d != r[0] || info(t, m, r[0]).Refs != 2 {
		t.Fatalf("dedup gave %x, refs %d", d, info(t, m, r[0]).Refs)
	}
	if _, err := m.BlockInfo(x[0]); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("the deduplicated block's handle: %v", err)
	}
	must(t, m.Retain(r[1]))
	if i := info(t, m, r[1]); i.Refs != 2 || i.Parent != 100 {
		t.Fatalf("retained: %+v", i)
	}
	must(t, m.Release([]kvtier.Block{d, r[1]}))
	if err := m.Pin(x); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("pinning a freed block: %v", err)
	}
	must(t, m.Release(r)) // later in the array: evicted first
	if i := info(t, m, r[0]); i.State != kvtier.BlockInactive || i.Refs != 0 {
		t.Fatalf("released: %+v", i)
	}
	evictable := func(want ...kvtier.Block) {
		t.Helper()
		got, err := m.Evictable(kvtier.G1, 10)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("evictable %v (%v), want %v", got, err, want)
		}
	}
	evictable(r[2], r[1], r[0])
	if got, _ := m.Evictable(kvtier.G1, 1); !reflect.DeepEqual(got, []kvtier.Block{r[2]}) {
		t.Fatalf("evictable, 1 at most: %v", got)
	}
	must(t, m.SetPriority(r[2:], 5))
	evictable(r[1], r[0], r[2])
	must(t, m.Pin(r[1:2]))
	evictable(r[0], r[2])
	if err := m.Pin([]kvtier.Block{r[0], r[2]}); !errors.Is(err, kvtier.ErrNoSpace) {
		t.Fatalf("a second pin beyond 25%%: %v", err)
	}
	if s, _ := m.TierStats(kvtier.G1); s.Pinned != 1 {
		t.Fatalf("pinned %d, want 1", s.Pinned)
	}
	must(t, m.Unpin(r[1:2]))
	evictable(r[0], r[1], r[2])       // unpinned: the most recent place of its priority
	got, err := m.Alloc(2, kvtier.G1) // the free slot, then r[0]
	must(t, err)
	if s, _ := m.TierStats(kvtier.G1); s.Evictions != 1 || s.Registered != 2 {
		t.Fatalf("after allocating 2: %+v", s)
	}
	if h, _ := m.Hashes(kvtier.G1); len(h) != 2 || h[0] == 100 || h[1] == 100 {
		t.Fatalf("hashes after evicting 100: %v", h)
	}
	must(t, m.Release(got))
	must(t, m.Check())
}

func sorted(h []uint64) []uint64 {
	sort.Slice(h, func(i, j int) bool { return h[i] < h[j] })
	return h
}

// Tier stats, the registry's hashes and the transfer counters follow an offload to G2.
func TestTierStatsHashesAndTransferStats(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	a := stored(t, m, []uint64{12, 10, 11}, 3)
	s, err := m.TierStats(kvtier.G1)
	must(t, err)
	if s.Capacity != 64 || s.Active != 3 || s.Free != 61 || s.Registered != 3 || s.Allocs != 3 ||
		s.Registrations != 3 || s.BlockBytes != 128 || s.Memory != kvtier.MemoryHost || s.MetadataBytes == 0 {
		t.Fatalf("G1: %+v", s)
	}
	if h, err := m.Hashes(kvtier.G1); err != nil || !reflect.DeepEqual(sorted(h), []uint64{10, 11, 12}) {
		t.Fatalf("G1 hashes %v (%v)", h, err)
	}
	if h, err := m.Hashes(kvtier.G2); err != nil || len(h) != 0 {
		t.Fatalf("G2 hashes before the offload %v (%v)", h, err)
	}
	x, err := m.Offload(a, kvtier.G2, nil, 0)
	must(t, err)
	defer x.Close()
	if n, err := x.Wait(-1); err != nil || n != 3 {
		t.Fatalf("offload: %d, %v", n, err)
	}
	ts, err := m.TransferStats(kvtier.G1, kvtier.G2)
	if err != nil || ts.Completed != 1 || ts.Blocks != 3 || ts.Bytes != 3*128 || ts.Failed != 0 ||
		ts.Cancelled != 0 || ts.Busy <= 0 {
		t.Fatalf("G1->G2: %+v (%v)", ts, err)
	}
	if ts, err := m.TransferStats(kvtier.G2, kvtier.G1); err != nil || ts != (kvtier.TransferStats{}) {
		t.Fatalf("G2->G1: %+v (%v)", ts, err)
	}
	if _, err := m.TransferStats(kvtier.G1, kvtier.G1); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("G1->G1: %v", err)
	}
	if h, _ := m.Hashes(kvtier.G2); !reflect.DeepEqual(sorted(h), []uint64{10, 11, 12}) {
		t.Fatalf("G2 hashes %v", h)
	}
	if s, _ := m.TierStats(kvtier.G2); s.Registered != 3 || s.Inactive != 3 || s.Registrations != 3 {
		t.Fatalf("G2: %+v", s)
	}
	if s, err := m.TierStats(kvtier.G3); err != nil || s != (kvtier.TierStats{}) {
		t.Fatalf("absent G3: %+v (%v)", s, err)
	}
	if _, err := m.TierStats(kvtier.G4); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("G4 stats: %v", err)
	}
	must(t, m.Release(a))
}

// The incremental hasher gives HashSequence's hashes whatever the split.
func TestSeqHashesLikeHashSequence(t *testing.T) {
	salt := kvtier.HashSalt([]byte("seq"))
	tokens := make([]uint32, 37)
	for i := range tokens {
		tokens[i] = uint32(7 * i)
	}
	want, err := kvtier.HashSequence(tokens, 4, salt)
	must(t, err)
	q, err := kvtier.NewSeq(salt, 4)
	must(t, err)
	for _, part := range [][]uint32{tokens[:5], tokens[5:5], tokens[5:25], tokens[25:]} {
		must(t, q.Append(part))
	}
	if n, blocks, err := q.Info(); err != nil || n != 37 || blocks != 9 {
		t.Fatalf("info: %d tokens, %d blocks, %v", n, blocks, err)
	}
	bh, sh, err := q.Hashes(0, 100)
	if err != nil || !reflect.DeepEqual(sh, want) || len(bh) != 9 || bh[0] != want[0] || bh[1] == want[1] {
		t.Fatalf("hashes: %v %v, want %v (%v)", bh, sh, want, err)
	}
	if _, sh, _ := q.Hashes(3, 2); !reflect.DeepEqual(sh, want[3:5]) {
		t.Fatalf("blocks 3..4: %v", sh)
	}
	if _, sh, _ := q.Hashes(9, 4); len(sh) != 0 {
		t.Fatalf("past the end: %v", sh)
	}
	must(t, q.Close())
	must(t, q.Close())
	if err := q.Append(tokens); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("append after Close: %v", err)
	}
	if _, err := kvtier.NewSeq(salt, 0); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("page size 0: %v", err)
	}
}

// A CUDA event fence: ErrUnsupported from a library built without CUDA; with it, a fence
// that only its event signals. A NULL event is refused either way.
func TestFenceFromCUDAEvent(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	if _, err := m.FenceFromCUDAEvent(0); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("a NULL event: %v", err)
	}
	f, err := m.FenceFromCUDAEvent(0x1000) // never read: no transfer waits on the fence
	if errors.Is(err, kvtier.ErrUnsupported) {
		t.Log("this kvtier was built without CUDA")
		return
	}
	must(t, err)
	if err := f.Signal(); !errors.Is(err, kvtier.ErrState) {
		t.Fatalf("signalling a CUDA event fence by hand: %v", err)
	}
	must(t, f.Close())
	if err := f.Signal(); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("a closed fence: %v", err)
	}
}

// WaitContext ends with the context, leaving the transfer to go on, and with the transfer.
func TestTransferWaitContext(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	a := stored(t, m, []uint64{60}, 6)
	f, err := m.NewFence()
	must(t, err)
	defer f.Close()
	x, err := m.Offload(a, kvtier.G2, f, 0)
	must(t, err)
	defer x.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := x.WaitContext(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := x.WaitContext(ctx)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel: %v", err)
	}
	must(t, f.Signal())
	if n, err := x.WaitContext(context.Background()); err != nil || n != 1 {
		t.Fatalf("after the signal: %d, %v", n, err)
	}
	must(t, m.Release(a))
}

// Every status but OK has a sentinel that errors.Is matches, and only it.
func TestEveryStatusHasASentinel(t *testing.T) {
	sentinels := map[kvtier.Status]error{
		kvtier.StatusAgain: kvtier.ErrAgain, kvtier.StatusTimeout: kvtier.ErrTimeout, kvtier.StatusIterOver: kvtier.ErrIterOver,
		kvtier.StatusInvalidArgument: kvtier.ErrInvalidArgument, kvtier.StatusInvalidHandle: kvtier.ErrInvalidHandle,
		kvtier.StatusState: kvtier.ErrState, kvtier.StatusNoSpace: kvtier.ErrNoSpace,
		kvtier.StatusCancelled: kvtier.ErrCancelled, kvtier.StatusUnsupported: kvtier.ErrUnsupported,
		kvtier.StatusIO: kvtier.ErrIO, kvtier.StatusCorrupt: kvtier.ErrCorrupt,
		kvtier.StatusNoMemory: kvtier.ErrNoMemory, kvtier.StatusCUDA: kvtier.ErrCUDA,
		kvtier.StatusNotFound: kvtier.ErrNotFound, kvtier.StatusInternal: kvtier.ErrInternal,
	}
	names := map[string]bool{}
	for s := kvtier.Status(-100); s <= 100; s++ {
		if name := s.String(); name != "KVT_UNKNOWN_STATUS" && s != kvtier.StatusOK {
			names[name] = true
			if sentinels[s] == nil {
				t.Errorf("status %d (%s) has no sentinel", s, name)
			}
		}
	}
	if len(names) != len(sentinels) {
		t.Errorf("%d statuses, %d sentinels", len(names), len(sentinels))
	}
	for s, sentinel := range sentinels {
		err := error(&kvtier.Error{Status: s, Message: "from a call"})
		for s2, other := range sentinels {
			if errors.Is(err, other) != (s == s2) {
				t.Errorf("errors.Is(%v, sentinel of %v) is %v", s, s2, s != s2)
			}
		}
		if sentinel.(*kvtier.Error).Status != s {
			t.Errorf("the sentinel of %v has status %v", s, sentinel.(*kvtier.Error).Status)
		}
	}
}
