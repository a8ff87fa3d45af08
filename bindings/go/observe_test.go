package kvtier_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"kvtier"
)

// A subscription sees G1's registrations and evictions in sequence; the event log holds the
// same events; the metrics text counts them; a log cut short reads to its last record.
func TestObserveSubscriptionLogAndMetrics(t *testing.T) {
	c := testConfig()
	c.G1Blocks = 4
	m, err := kvtier.NewManager(c)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sub, err := m.Subscribe(1000)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	log := filepath.Join(t.TempDir(), "run.kvtlog")
	if err := m.Record(log); err != nil {
		t.Fatal(err)
	}
	hashes := []uint64{101, 102, 103, 104, 105, 106}
	for _, h := range hashes {
		b, err := m.Alloc(1, kvtier.G1)
		if err != nil {
			t.Fatal(err)
		}
		r, err := m.RegisterHashes(b, []uint64{h}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Release(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.StopRecording(); err != nil {
		t.Fatal(err)
	}
	ev, err := sub.Drain(1000)
	if err != nil {
		t.Fatal(err)
	}
	var stored, removed []uint64
	for i, e := range ev {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
		switch e.Kind {
		case "BLOCK_STORED":
			stored = append(stored, e.Hash)
		case "BLOCK_REMOVED":
			removed = append(removed, e.Hash)
		}
	}
	if !reflect.DeepEqual(stored, hashes) || !reflect.DeepEqual(removed, []uint64{101, 102}) {
		t.Fatalf("stored %v, removed %v", stored, removed)
	}
	logged, torn, _, err := kvtier.ReadEventLog(log)
	if err != nil || torn || !reflect.DeepEqual(logged, ev) {
		t.Fatalf("the log differs: %v, torn %v, %d vs %d events", err, torn, len(logged), len(ev))
	}
	text, err := m.MetricsText()
	if err != nil || !strings.Contains(text, `kvtier_tier_evictions_total{tier="G1"} 2`) {
		t.Fatalf("metrics: %v\n%s", err, text)
	}
	data, _ := os.ReadFile(log)
	cut := log + ".cut"
	os.WriteFile(cut, data[:len(data)-5], 0o644)
	part, torn, why, err := kvtier.ReadEventLog(cut)
	if err != nil || !torn || len(part) != len(ev)-1 || !strings.Contains(why, "cut there") {
		t.Fatalf("cut log: %v, torn %v (%s), %d events", err, torn, why, len(part))
	}
	if _, _, _, err := kvtier.ReadEventLog(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing log was read")
	}
}
