package kvtier_test

import (
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

// testConfig is the tests' small manager: 4 tokens a block, 128 bytes, 64 blocks in G1 and G2.
func testConfig() kvtier.Config {
	c := kvtier.DefaultConfig()
	c.PageSize, c.NumLayers, c.NumOuter, c.ChunkBytes = 4, 1, 2, 64
	c.G1Blocks, c.G2Blocks, c.MinBatchSize, c.FlushIntervalUs = 64, 64, 1, 1000
	return c
}

func newManager(t testing.TB) *kvtier.Manager {
	t.Helper()
	m, err := kvtier.NewManager(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func stored(t testing.TB, m *kvtier.Manager, hashes []uint64, fill byte) []kvtier.Block {
	t.Helper()
	b, err := m.Alloc(len(hashes), kvtier.G1)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range b {
		d, err := m.Data(x)
		if err != nil {
			t.Fatal(err)
		}
		for i := range d {
			d[i] = fill
		}
	}
	out, err := m.RegisterHashes(b, hashes, 0)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestHashing(t *testing.T) {
	tokens := make([]uint32, 37)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	h, err := kvtier.HashSequence(tokens, 4, kvtier.HashSalt([]byte("salt")))
	if err != nil || len(h) != 9 {
		t.Fatalf("%v %d", err, len(h))
	}
	h2, _ := kvtier.HashSequence(tokens[:8], 4, kvtier.HashSalt([]byte("salt")))
	if h2[0] != h[0] || h2[1] != h[1] {
		t.Fatal("a prefix must hash the same")
	}
	if _, err := kvtier.HashSequence(tokens, 3, 0); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("page size 3: %v", err)
	}
}

func TestDedupAndPrefixMatch(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	a := stored(t, m, []uint64{1, 2, 3}, 1)
	again, _ := m.Alloc(1, kvtier.G1)
	dup, err := m.RegisterHashes(again, []uint64{2}, 1)
	if err != nil || dup[0] != a[1] {
		t.Fatalf("dedup: %v %v", err, dup)
	}
	got, err := m.MatchPrefix([]uint64{1, 2, 3, 4}, kvtier.G1)
	if err != nil || len(got) != 3 || got[2] != a[2] {
		t.Fatalf("match: %v %v", err, got)
	}
	for _, r := range [][]kvtier.Block{got, dup, a} {
		if err := m.Release(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestOffloadCompletesThroughTheEventFD(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	a := stored(t, m, []uint64{10, 11}, 0x5a)
	m.Poll(256)
	x, err := m.Offload(a, kvtier.G2, nil, 77)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	fd := m.EventFD()
	var done *kvtier.Event
	for deadline := time.Now().Add(10 * time.Second); done == nil && time.Now().Before(deadline); {
		var set syscall.FdSet
		set.Bits[fd/64] |= 1 << (uint(fd) % 64)
		tv := syscall.Timeval{Sec: 1}
		if _, err := syscall.Select(fd+1, &set, nil, nil, &tv); err != nil && err != syscall.EINTR {
			t.Fatal(err)
		}
		ev, _ := m.Poll(64)
		for i := range ev {
			if ev[i].Type == kvtier.EventXferDone {
				done = &ev[i]
			}
		}
	}
	if done == nil || done.UserData != 77 || done.Count != 2 || done.Status != kvtier.StatusOK {
		t.Fatalf("XFER_DONE: %+v", done)
	}
	g2, _ := m.MatchPrefix([]uint64{10, 11}, kvtier.G2)
	d, _ := m.Data(g2[1])
	if len(g2) != 2 || d[0] != 0x5a || d[len(d)-1] != 0x5a {
		t.Fatal("G2 does not hold the bytes")
	}
	m.Release(g2)
	m.Release(a)
}

func TestCancelIsErrCancelled(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	a := stored(t, m, []uint64{30}, 0)
	f, err := m.NewFence()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x, err := m.Offload(a, kvtier.G2, f, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Wait(1e6); !errors.Is(err, kvtier.ErrTimeout) {
		t.Fatalf("wait before the fence: %v", err)
	}
	if err := x.Cancel(); err != nil {
		t.Fatal(err)
	}
	_, err = x.Wait(-1)
	if !errors.Is(err, kvtier.ErrCancelled) || errors.Is(err, kvtier.ErrIO) {
		t.Fatalf("want ErrCancelled, got %v", err)
	}
	x.Close()
	m.Release(a)
}

func TestResetCancelsEmptiesAndKeepsHeldBytes(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	a := stored(t, m, []uint64{50, 51}, 9)
	x, err := m.Offload(a, kvtier.G2, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Wait(-1); err != nil {
		t.Fatal(err)
	}
	x.Close()
	b := stored(t, m, []uint64{52}, 3) // not in G2: it waits for the fence
	f, err := m.NewFence()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	parked, err := m.Offload(b, kvtier.G2, f, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer parked.Close()
	m.Poll(256)
	if err := m.Reset(kvtier.AllTiers); err != nil {
		t.Fatal(err)
	}
	if _, err := parked.Wait(-1); !errors.Is(err, kvtier.ErrCancelled) {
		t.Fatalf("parked transfer after a reset: %v", err)
	}
	ev, _ := m.Poll(256)
	var cleared []kvtier.Tier
	removed, done := 0, 0
	for _, e := range ev {
		switch e.Type {
		case kvtier.EventTierCleared:
			cleared = append(cleared, e.Tier)
		case kvtier.EventBlockRemoved:
			removed++
		case kvtier.EventXferDone:
			done++
		}
	}
	if len(cleared) != 2 || cleared[0] != kvtier.G1 || cleared[1] != kvtier.G2 ||
		removed != 5 || done != 1 {
		t.Fatalf("events: cleared %v, %d removed, %d done", cleared, removed, done)
	}
	if g, _ := m.MatchPrefix([]uint64{50}, kvtier.G2); len(g) != 0 {
		t.Fatal("G2 still matches after the reset")
	}
	if d, err := m.Data(a[0]); err != nil || d[0] != 9 || d[len(d)-1] != 9 {
		t.Fatalf("a held block lost its bytes: %v", err)
	}
	if err := m.Reset(kvtier.G3); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("reset of an absent tier: %v", err)
	}
	m.Release(append(a, b...))
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestBadInputGivesTypedErrors(t *testing.T) {
	m := newManager(t)
	err := m.Release([]kvtier.Block{12345})
	var e *kvtier.Error
	if !errors.As(err, &e) || e.Status != kvtier.StatusInvalidHandle || e.Message == "" {
		t.Fatalf("forged handle: %v", err)
	}
	if _, err := m.Alloc(1, kvtier.Tier(9)); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("bad tier: %v", err)
	}
	if _, err := m.Alloc(1000, kvtier.G1); !errors.Is(err, kvtier.ErrNoSpace) {
		t.Fatalf("too many: %v", err)
	}
	if _, err := m.RegisterHashes([]kvtier.Block{1}, nil, 0); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("length mismatch: %v", err)
	}
	bad := kvtier.DefaultConfig()
	bad.PageSize = 3
	if _, err := kvtier.NewManager(bad); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("bad config: %v", err)
	}
	a := stored(t, m, []uint64{5}, 0)
	x, _ := m.Offload(a, kvtier.G2, nil, 0)
	f, _ := m.NewFence()
	m.Close() // before its transfer and fence: both become invalid, not dangling
	if _, err := m.Alloc(1, kvtier.G1); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("closed manager: %v", err)
	}
	if _, err := x.Wait(-1); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("transfer of a closed manager: %v", err)
	}
	if err := f.Signal(); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("fence of a closed manager: %v", err)
	}
	x.Close()
	f.Close()
	m.Close()
}

func TestGoroutinesShareOneManager(t *testing.T) {
	cfg := testConfig()
	cfg.G1Blocks, cfg.G2Blocks, cfg.MinBatchSize, cfg.FlushIntervalUs = 1024, 1024, 8, 10000
	m, err := kvtier.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				base := uint64(g*100000 + i*4)
				h := []uint64{base + 1, base + 2, base + 3}
				b, err := m.Alloc(3, kvtier.G1)
				if err == nil {
					b, err = m.RegisterHashes(b, h, 0)
				}
				var x *kvtier.Transfer
				if err == nil {
					x, err = m.Offload(b, kvtier.G2, nil, uint64(g))
				}
				if err == nil {
					_, err = x.Wait(-1)
					x.Close()
				}
				if err == nil {
					var got []kvtier.Block
					got, err = m.MatchPrefix(h, kvtier.G1)
					if err == nil && len(got) != 3 {
						err = errors.New("prefix lost")
					}
					if err == nil {
						err = m.Release(got)
					}
				}
				if err == nil {
					err = m.Release(b)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

// The cost of one kvt_tier_match_prefix of one block through cgo (docs/BENCHMARKS.md). Each call
// pins the block once more; the manager's Close drops the pins.
func BenchmarkMatchPrefix1(b *testing.B) {
	m := newManager(b)
	defer m.Close()
	blocks := stored(b, m, []uint64{99}, 0)
	m.Release(blocks)
	h := []uint64{99}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.MatchPrefix(h, kvtier.G1)
	}
}
