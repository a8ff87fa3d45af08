package kvtier_test

import (
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

// 0.5.0's conforming calls (docs/CONVENTIONS.md) under the package's unchanged API: the
// calls that fill an array set the total, of which the wrappers keep what they asked for;
// the event log ends on KVT_ITEROVER; the pause wait ends on KVT_TIMEOUT.

// KVT_ITEROVER has its name, its sentinel, and is an outcome (a positive status).
func TestIterOverStatus(t *testing.T) {
	if kvtier.StatusIterOver != 3 || kvtier.StatusIterOver.String() != "KVT_ITEROVER" {
		t.Fatalf("StatusIterOver is %d, %q", int32(kvtier.StatusIterOver), kvtier.StatusIterOver.String())
	}
	err := error(&kvtier.Error{Status: kvtier.StatusIterOver, Message: "past the last record"})
	if !errors.Is(err, kvtier.ErrIterOver) || errors.Is(err, kvtier.ErrNotFound) || errors.Is(err, kvtier.ErrAgain) {
		t.Fatalf("errors.Is on %v", err)
	}
	for _, s := range []kvtier.Status{kvtier.StatusAgain, kvtier.StatusTimeout, kvtier.StatusIterOver} {
		if s <= kvtier.StatusOK {
			t.Errorf("%v is not an outcome: %d", s, int32(s))
		}
	}
}

// A log read to its end ends cleanly (KVT_ITEROVER, not an error), an empty one at once.
func TestReadEventLogEndsCleanly(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.kvtlog")
	must(t, m.Record(empty))
	must(t, m.StopRecording())
	if ev, torn, why, err := kvtier.ReadEventLog(empty); err != nil || torn || why != "" || len(ev) != 0 {
		t.Fatalf("an empty log: %d events, torn %v (%q), %v", len(ev), torn, why, err)
	}
	log := filepath.Join(dir, "run.kvtlog")
	must(t, m.Record(log))
	stored(t, m, []uint64{1, 2, 3}, 7)
	must(t, m.StopRecording())
	ev, torn, why, err := kvtier.ReadEventLog(log)
	if err != nil || torn || why != "" || len(ev) == 0 {
		t.Fatalf("a log: %d events, torn %v (%q), %v", len(ev), torn, why, err)
	}
	again, _, _, err := kvtier.ReadEventLog(log)
	if err != nil || !reflect.DeepEqual(again, ev) {
		t.Fatalf("read again: %d events, %v", len(again), err)
	}
}

// The tier counts every block it could evict; Evictable keeps the first max of them, in
// order, whatever the count.
func TestEvictableKeepsTheFirstMax(t *testing.T) {
	cfg := testConfig()
	cfg.G1Blocks = 8
	m, err := kvtier.NewManager(cfg)
	must(t, err)
	defer m.Close()
	b, err := m.Alloc(5, kvtier.G1)
	must(t, err)
	r, err := m.RegisterHashes(b, []uint64{11, 12, 13, 14, 15}, 0)
	must(t, err)
	must(t, m.Release(r))
	all, err := m.Evictable(kvtier.G1, 100)
	if err != nil || len(all) != 5 {
		t.Fatalf("evictable: %v (%v), want 5 blocks", all, err)
	}
	for max := 0; max <= 6; max++ {
		got, err := m.Evictable(kvtier.G1, max)
		want := all
		if max < len(all) {
			want = all[:max]
		}
		if err != nil || len(got) != len(want) || (len(want) > 0 && !reflect.DeepEqual(got, want)) {
			t.Errorf("evictable, %d at most: %v (%v), want %v", max, got, err, want)
		}
	}
	if got, err := m.Evictable(kvtier.G2, 4); err != nil || len(got) != 0 {
		t.Errorf("an empty tier: %v, %v", got, err)
	}
}

// Seq.Hashes keeps the first max of the complete blocks from first on; HashSequence gives
// every full block, none for a trailing partial one.
func TestHashesKeepTheFirstMax(t *testing.T) {
	salt := kvtier.HashSalt([]byte("conventions"))
	tokens := tokenRange(4*6 + 3) // six full blocks of 4, and 3 tokens over
	want, err := kvtier.HashSequence(tokens, 4, salt)
	if err != nil || len(want) != 6 {
		t.Fatalf("HashSequence: %d hashes, %v", len(want), err)
	}
	if h, err := kvtier.HashSequence(tokens[:3], 4, salt); err != nil || len(h) != 0 {
		t.Fatalf("no full block: %v, %v", h, err)
	}
	if h, err := kvtier.HashSequence(nil, 4, salt); err != nil || len(h) != 0 {
		t.Fatalf("no tokens: %v, %v", h, err)
	}
	q, err := kvtier.NewSeq(salt, 4)
	must(t, err)
	defer q.Close()
	must(t, q.Append(tokens))
	for first := 0; first <= 6; first++ {
		for max := 0; max <= 8; max++ {
			bh, sh, err := q.Hashes(first, max)
			n := 6 - first
			if max < n {
				n = max
			}
			if err != nil || len(bh) != n || len(sh) != n ||
				(n > 0 && !reflect.DeepEqual(sh, want[first:first+n])) {
				t.Fatalf("Hashes(%d, %d): %d block, %d sequence hashes, %v; want %d", first, max,
					len(bh), len(sh), err, n)
			}
		}
	}
	if _, _, err := q.Hashes(7, 2); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("first beyond the complete blocks: %v", err)
	}
}

// With nothing paused, WaitPaused ends ErrTimeout after its timeout, sub-millisecond ones
// included, and not long after.
func TestWaitPausedTimesOut(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	c := schedulerOver(t, m)
	defer c.Close()
	for _, d := range []time.Duration{0, 200 * time.Microsecond, 30 * time.Millisecond} {
		start := time.Now()
		_, err := c.WaitPaused(d)
		took := time.Since(start)
		var e *kvtier.Error
		if !errors.Is(err, kvtier.ErrTimeout) || !errors.As(err, &e) || e.Message == "" {
			t.Fatalf("WaitPaused(%v) with nothing paused: %v", d, err)
		}
		if took < d || took > d+5*time.Second {
			t.Errorf("WaitPaused(%v) took %v", d, took)
		}
	}
}
