package kvtier_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	kvtier "github.com/kvtier/kvtier/bindings/go"
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
	// The library's JSON of an event: names, not numbers.
	want := fmt.Sprintf(`{"seq":%d,"time_ns":%d,"kind":"BLOCK_STORED","parent_hash":0,"hash":101,"tier":"G1"}`,
		ev[0].Seq, ev[0].TimeNs)
	if j, err := ev[0].JSON(); err != nil || j != want {
		t.Fatalf("JSON: %v\n%s\nwant %s", err, j, want)
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

// A connector whose config serves the management endpoint (its socket lives as long as the
// connector), and its recorded calls, made again on a fresh connector, ending in the same
// slot states; a connector with too few G1 blocks differs, and says where.
func TestConnectorEndpointAndRerun(t *testing.T) {
	dir := t.TempDir()
	log, sock := filepath.Join(dir, "run.kvtlog"), filepath.Join(dir, "k.sock")
	tokens := []uint32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	cfg := kvtier.DefaultConnectorConfig()
	cfg.Role, cfg.NumGPUBlocks = kvtier.RoleScheduler, 8
	m := newManager(t)
	withEndpoint := cfg
	withEndpoint.EndpointPath, withEndpoint.PauseTimeoutMs = sock, 500
	c, err := m.NewConnector(withEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("no endpoint socket: %v", err)
	}
	if err := m.Record(log); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.GetNumNewMatchedTokens("r1", tokens, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateStateAfterAlloc("r1", []uint32{5, 6, 7}, 0); err != nil {
		t.Fatal(err)
	}
	if err := m.StopRecording(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	m.Close()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("the socket outlived its connector: %v", err)
	}

	m2 := newManager(t)
	defer m2.Close()
	fresh, err := m2.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := fresh.Rerun(log)
	if err != nil || r.Calls != 2 || r.LiveSlots != 1 {
		t.Fatalf("rerun: %+v %v", r, err)
	}
	if st, _, err := fresh.SlotState("r1"); err != nil || st != kvtier.SlotInitialized {
		t.Fatalf("r1 is %v (%v)", st, err)
	}
	fresh.Close()

	small := cfg
	small.NumGPUBlocks = 6
	sc, err := m2.NewConnector(small)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	_, err = sc.Rerun(log)
	var e *kvtier.Error
	if !errors.As(err, &e) || e.Status != kvtier.StatusCorrupt ||
		!strings.Contains(e.Message, "UPDATE_STATE_AFTER_ALLOC 'r1'") {
		t.Fatalf("rerun on 6 G1 blocks: %v", err)
	}
}
