package kvtier_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

// offloadToG3 stores blocks of the given hashes and fills in G1 and copies them to G3.
func offloadToG3(t *testing.T, m *kvtier.Manager, hashes []uint64, fill byte) {
	t.Helper()
	a := stored(t, m, hashes, fill)
	x, err := m.Offload(a, kvtier.G3, nil, 0)
	must(t, err)
	defer x.Close()
	if n, err := x.Wait(-1); err != nil || n != uint64(len(hashes)) {
		t.Fatalf("offload to G3: %d, %v", n, err)
	}
	must(t, m.Release(a))
}

// onboardFromG3 brings a G3 block back into G1 and returns its bytes.
func onboardFromG3(t *testing.T, m *kvtier.Manager, hash uint64) ([]byte, error) {
	t.Helper()
	src, err := m.MatchPrefix([]uint64{hash}, kvtier.G3)
	must(t, err)
	if len(src) != 1 {
		t.Fatalf("G3 lacks %d", hash)
	}
	defer m.Release(src)
	dst, err := m.Alloc(1, kvtier.G1)
	must(t, err)
	x, err := m.Onboard(src, dst, nil, 0)
	must(t, err)
	defer x.Close()
	if _, err := x.Wait(-1); err != nil {
		m.Release(dst)
		return nil, err
	}
	got, err := x.Blocks()
	must(t, err)
	defer m.Release(got)
	d, err := m.Data(got[0])
	return append([]byte(nil), d...), err
}

// A persistent G3 outlives its manager; the next one, of the same namespace, recovers its
// blocks and their bytes. Another namespace is a mismatch: refused, or reset.
func TestPersistentG3RecoversAndMismatchesByNamespace(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig()
	cfg.G3Blocks, cfg.G3Path, cfg.G3Persist, cfg.G3Namespace = 8, dir, true, 42
	cfg.Eviction = [3]kvtier.Eviction{kvtier.EvictLRU, kvtier.EvictS3FIFO, kvtier.EvictS3FIFO}
	m, err := kvtier.NewManager(cfg)
	must(t, err)
	offloadToG3(t, m, []uint64{21, 22}, 0x42)
	m.Close()
	if _, err := os.Stat(filepath.Join(dir, "kvtier-g3.bin")); err != nil {
		t.Fatalf("the persistent file is gone: %v", err)
	}

	m, err = kvtier.NewManager(cfg)
	must(t, err)
	if s, _ := m.TierStats(kvtier.G3); s.Recovered != 2 || s.Inactive != 2 {
		t.Fatalf("recovered G3: %+v", s)
	}
	if d, err := onboardFromG3(t, m, 22); err != nil || !bytes.Equal(d, bytes.Repeat([]byte{0x42}, 128)) {
		t.Fatalf("a recovered block's bytes: %v %v", d, err)
	}
	m.Close()

	other := cfg
	other.G3Namespace, other.G3OnMismatch = 43, kvtier.G3Refuse
	if _, err := kvtier.NewManager(other); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("another namespace, refused: %v", err)
	}
	other.G3OnMismatch = kvtier.G3Reset
	m, err = kvtier.NewManager(other)
	must(t, err)
	defer m.Close()
	if s, _ := m.TierStats(kvtier.G3); s.Recovered != 0 || s.Registered != 0 {
		t.Fatalf("a reset G3: %+v", s)
	}

	notPersistent := testConfig()
	notPersistent.G3Persist = true // without G3
	if _, err := kvtier.NewManager(notPersistent); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("g3_persist without G3: %v", err)
	}
}

// G3KeyEnv: slots written under one key fail their MAC under another (ErrCorrupt), and are
// never served.
func TestG3KeyEnvAuthenticatesSlots(t *testing.T) {
	t.Setenv("KVTIER_TEST_G3_KEY", strings.Repeat("00112233445566778899aabbccddeeff", 2))
	t.Setenv("KVTIER_TEST_G3_OTHER", strings.Repeat("ffeeddccbbaa99887766554433221100", 2))
	dir := t.TempDir()
	cfg := testConfig()
	cfg.G3Blocks, cfg.G3Path, cfg.G3Persist, cfg.G3KeyEnv = 8, dir, true, "KVTIER_TEST_G3_KEY"
	m, err := kvtier.NewManager(cfg)
	must(t, err)
	offloadToG3(t, m, []uint64{31}, 0x31)
	if d, err := onboardFromG3(t, m, 31); err != nil || d[0] != 0x31 {
		t.Fatalf("read under its own key: %v", err)
	}
	m.Close()

	cfg.G3KeyEnv = "KVTIER_TEST_G3_OTHER"
	m, err = kvtier.NewManager(cfg)
	must(t, err)
	defer m.Close()
	if _, err := onboardFromG3(t, m, 31); !errors.Is(err, kvtier.ErrCorrupt) {
		t.Fatalf("read under another key: %v", err)
	}
	if g, _ := m.MatchPrefix([]uint64{31}, kvtier.G3); len(g) != 0 {
		t.Fatal("the forged slot is still matched")
	}

	noG3 := testConfig()
	noG3.G3KeyEnv = "KVTIER_TEST_G3_KEY"
	if _, err := kvtier.NewManager(noG3); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("g3_key_env without G3: %v", err)
	}
}

// The KV events fields reach the library: a manager publishes with all of them set, and
// each bad value is refused with a message naming its field. NoteTokens wants a page of
// tokens per hash.
func TestKVEventsConfig(t *testing.T) {
	d := kvtier.DefaultConfig()
	if d.KVEventsBuffer != 10000 || d.KVEventsTiers != 1<<kvtier.G1|1<<kvtier.G2|1<<kvtier.G3 ||
		d.KVEventsFormat != kvtier.KVEventsFormatCurrent || d.MaxPinnedPercent != 50 ||
		d.Eviction != [3]kvtier.Eviction{} || d.G4TimeoutUs != 1000000 {
		t.Fatalf("defaults: %+v", d)
	}
	cfg := testConfig()
	cfg.KVEventsEndpoint, cfg.KVEventsReplayEndpoint = "inproc://kvtier-go-events", "inproc://kvtier-go-replay"
	cfg.KVEventsTopic, cfg.KVEventsBuffer, cfg.KVEventsDPRank = "kv", 100, 1
	cfg.KVEventsTiers, cfg.KVEventsFormat = 1<<kvtier.G1|1<<kvtier.G2, kvtier.KVEventsFormatArrayV0_11
	m, err := kvtier.NewManager(cfg)
	must(t, err)
	defer m.Close()
	must(t, m.NoteTokens([]uint64{1, 2}, tokenRange(8)))
	if err := m.NoteTokens([]uint64{1, 2}, tokenRange(7)); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("7 tokens for 2 blocks: %v", err)
	}
	a := stored(t, m, []uint64{1, 2}, 0)
	must(t, m.Release(a))

	for field, change := range map[string]func(*kvtier.Config){
		"kv_events_replay_endpoint": func(c *kvtier.Config) { c.KVEventsEndpoint = "" },
		"kv_events_buffer":          func(c *kvtier.Config) { c.KVEventsBuffer = 0 },
		"kv_events_dp_rank":         func(c *kvtier.Config) { c.KVEventsDPRank = -1 },
		"kv_events_tiers":           func(c *kvtier.Config) { c.KVEventsTiers = 1 << kvtier.G4 },
		"kv_events_format":          func(c *kvtier.Config) { c.KVEventsFormat = 2 },
		"kv_events_endpoint":        func(c *kvtier.Config) { c.KVEventsEndpoint, c.KVEventsReplayEndpoint = "nonsense", "" },
		"eviction":                  func(c *kvtier.Config) { c.Eviction[1] = 7 },
		"max_pinned_percent":        func(c *kvtier.Config) { c.MaxPinnedPercent = 101 },
	} {
		bad := cfg
		bad.KVEventsEndpoint, bad.KVEventsReplayEndpoint = "inproc://kvtier-go-bad", "inproc://kvtier-go-bad-replay"
		change(&bad)
		var e *kvtier.Error
		if _, err := kvtier.NewManager(bad); !errors.As(err, &e) || !strings.Contains(e.Message, field) {
			t.Errorf("bad %s: %v", field, err)
		}
	}
}
