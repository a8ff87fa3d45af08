package kvtier_test

import (
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

// The recorder's ring keeps the last events; its dump is an event log that replays onto a
// fresh manager, which ends with the recorded registry, and a second replay onto it finds
// every hash stored twice.
func TestRecorderRingDumpAndReplay(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	must(t, m.RecorderRing(1000))
	sub, err := m.Subscribe(1000)
	must(t, err)
	if sub.FD() < 0 || sub.Fd() != sub.FD() {
		t.Fatal("no fd for the subscription")
	}
	hashes := []uint64{71, 72, 73}
	must(t, m.Release(stored(t, m, hashes, 1)))
	log := filepath.Join(t.TempDir(), "ring.kvtlog")
	must(t, m.RecorderDump(log))
	live, err := sub.Drain(1000)
	must(t, err)
	must(t, sub.Close())
	must(t, sub.Close())
	if sub.FD() != -1 {
		t.Fatal("a closed subscription has an fd")
	}
	dumped, torn, _, err := kvtier.ReadEventLog(log)
	if err != nil || torn || len(dumped) == 0 || !reflect.DeepEqual(dumped, live) {
		t.Fatalf("the dump differs from the stream: %v, torn %v, %d vs %d events", err, torn, len(dumped), len(live))
	}

	r, err := kvtier.ReplayEventLog(nil, log)
	if err != nil || r.Events != uint64(len(dumped)) || r.Violations != 0 || r.Torn || r.Registered[kvtier.G1] != 3 {
		t.Fatalf("replay without a manager: %+v (%v)", r, err)
	}
	fresh := newManager(t)
	defer fresh.Close()
	_, err = kvtier.ReplayEventLog(fresh, log)
	must(t, err)
	if h, _ := fresh.Hashes(kvtier.G1); !reflect.DeepEqual(sorted(h), hashes) {
		t.Fatalf("the replayed registry: %v", h)
	}
	r, err = kvtier.ReplayEventLog(fresh, log)
	if !errors.Is(err, kvtier.ErrCorrupt) || r.Violations != 3 {
		t.Fatalf("replaying onto a manager that holds the hashes: %+v (%v)", r, err)
	}
	if err := m.RecorderDump(t.TempDir()); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("a dump onto a directory: %v", err)
	}
	if err := m.RecorderRing(1 << 25); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("a ring of 2^25 events: %v", err)
	}
}

func TestTriggerAndCandidateStateNames(t *testing.T) {
	for v, want := range map[interface{ String() string }]string{
		kvtier.TriggerGetNumNewMatchedTokens: "GET_NUM_NEW_MATCHED_TOKENS",
		kvtier.TriggerResetCache:             "RESET_CACHE",
		kvtier.Trigger(99):                   "UNKNOWN",
		kvtier.CandidatePendingEvaluation:    "PENDING_EVALUATION",
		kvtier.CandidateCancelled:            "CANCELLED",
		kvtier.CandidateState(0):             "UNKNOWN",
	} {
		if v.String() != want {
			t.Errorf("%#v is %q, want %q", v, v.String(), want)
		}
	}
}
