package kvtier_test

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

const redisPassword = "go-test-secret"

// startRedis runs a redis-server of its own on a Unix socket, with a password, until the
// test ends; it returns the socket's path once the server answers PING.
func startRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed: G4 needs a Redis to talk to")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "r.sock")
	cmd := exec.Command(bin, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--dir", dir, "--requirepass", redisPassword)
	out, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := bufio.NewScanner(out)
	for !strings.Contains(strings.ToLower(lines.Text()), "ready to accept connections") {
		if !lines.Scan() {
			t.Fatalf("redis-server ended before it was ready: %v", lines.Err())
		}
	}
	go func() { // keep its log from filling the pipe
		for lines.Scan() {
		}
	}()
	conn, err := net.Dial("unix", sock)
	must(t, err)
	defer conn.Close()
	conn.Write([]byte("AUTH " + redisPassword + "\r\nPING\r\n"))
	r := bufio.NewReader(conn)
	for _, want := range []string{"+OK\r\n", "+PONG\r\n"} {
		if got, err := r.ReadString('\n'); got != want {
			t.Fatalf("redis answered %q (%v), want %q", got, err, want)
		}
	}
	return sock
}

// G4 over a real Redis: one manager offloads blocks to it, another (as on another host)
// finds them and onboards their bytes; namespaces, prefixes, keys and passwords keep
// managers apart.
func TestG4RoundTripThroughRedis(t *testing.T) {
	sock := startRedis(t)
	t.Setenv("KVTIER_TEST_REDIS_PW", redisPassword)
	t.Setenv("KVTIER_TEST_G4_KEY", strings.Repeat("0123456789abcdef", 4))
	t.Setenv("KVTIER_TEST_OTHER_KEY", strings.Repeat("fedcba9876543210", 4))
	t.Setenv("KVTIER_TEST_BAD_PW", "wrong")
	cfg := testConfig()
	cfg.G4URL, cfg.G4PasswordEnv, cfg.G4KeyPrefix = "unix://"+sock, "KVTIER_TEST_REDIS_PW", "kvtier-go-test"
	cfg.G4Namespace, cfg.G4TimeoutUs, cfg.G4KeyEnv = 7, 5000000, "KVTIER_TEST_G4_KEY"
	newG4 := func(change func(*kvtier.Config)) *kvtier.Manager {
		t.Helper()
		c := cfg
		change(&c)
		m, err := kvtier.NewManager(c)
		must(t, err)
		t.Cleanup(func() { m.Close() })
		return m
	}
	same := func(*kvtier.Config) {}
	hashes := []uint64{401, 402, 403}

	writer := newG4(same)
	src, err := writer.Alloc(3, kvtier.G1)
	must(t, err)
	want := make([][]byte, 3)
	for i, b := range src {
		d, err := writer.Data(b)
		must(t, err)
		for j := range d {
			d[j] = byte(31*i + j)
		}
		want[i] = append([]byte(nil), d...)
	}
	src, err = writer.RegisterHashes(src, hashes, 0)
	must(t, err)
	x, err := writer.Offload(src, kvtier.G4, nil, 0)
	must(t, err)
	if n, err := x.Wait(-1); err != nil || n != 3 {
		t.Fatalf("offload to G4: %d, %v", n, err)
	}
	x.Close()
	if n, err := writer.G4Match(append(hashes, 404)); err != nil || n != 3 {
		t.Fatalf("match: %d, %v", n, err)
	}
	s, err := writer.G4Stats()
	if err != nil || s.Shards != 1 || s.StoredBlocks != 3 || s.BytesWritten < 3*128 || s.Lookups != 4 ||
		s.Hits != 3 || s.RoundTrips == 0 {
		t.Fatalf("writer's G4 stats: %+v (%v)", s, err)
	}
	if ts, _ := writer.TransferStats(kvtier.G1, kvtier.G4); ts.Completed != 1 || ts.Blocks != 3 {
		t.Fatalf("G1->G4: %+v", ts)
	}

	reader := newG4(same)
	dst, err := reader.Alloc(3, kvtier.G1)
	must(t, err)
	x, err = reader.G4Onboard(hashes, 0, dst, nil, 9)
	must(t, err)
	if n, err := x.Wait(-1); err != nil || n != 3 {
		t.Fatalf("onboard from G4: %d, %v", n, err)
	}
	got, err := x.Blocks()
	must(t, err)
	x.Close()
	for i, b := range got {
		if d, err := reader.Data(b); err != nil || !bytes.Equal(d, want[i]) {
			t.Fatalf("block %d came back as %v (%v)", i, d[:8], err)
		}
	}
	if h, _ := reader.Hashes(kvtier.G1); len(h) != 3 {
		t.Fatalf("the onboarded blocks are not registered: %v", h)
	}
	if s, _ := reader.G4Stats(); s.LoadedBlocks != 3 || s.BytesRead < 3*128 {
		t.Fatalf("reader's G4 stats: %+v", s)
	}

	// A hash nobody stored: the onboard ends ErrNotFound.
	empty, _ := reader.Alloc(1, kvtier.G2)
	x, err = reader.G4Onboard([]uint64{999}, 0, empty, nil, 0)
	must(t, err)
	if _, err := x.Wait(-1); !errors.Is(err, kvtier.ErrNotFound) {
		t.Fatalf("onboard of a missing hash: %v", err)
	}
	x.Close()
	if s, _ := reader.G4Stats(); s.MissingBlocks != 1 {
		t.Fatalf("missing blocks: %+v", s)
	}

	for name, change := range map[string]func(*kvtier.Config){
		"another namespace": func(c *kvtier.Config) { c.G4Namespace = 8 },
		"another prefix":    func(c *kvtier.Config) { c.G4KeyPrefix = "other" },
	} {
		if n, err := newG4(change).G4Match(hashes); err != nil || n != 0 {
			t.Errorf("%s sees %d blocks (%v)", name, n, err)
		}
	}
	if _, err := newG4(func(c *kvtier.Config) { c.G4PasswordEnv = "KVTIER_TEST_BAD_PW" }).G4Match(hashes); !errors.Is(err, kvtier.ErrIO) {
		t.Errorf("a wrong password: %v", err)
	}
	// Another key: the values fail their MAC and are misses, never served (and deleted).
	forger := newG4(func(c *kvtier.Config) { c.G4KeyEnv = "KVTIER_TEST_OTHER_KEY" })
	dst, _ = forger.Alloc(1, kvtier.G1)
	x, err = forger.G4Onboard(hashes[:1], 0, dst, nil, 0)
	must(t, err)
	if _, err := x.Wait(-1); !errors.Is(err, kvtier.ErrCorrupt) {
		t.Fatalf("onboard under another key: %v", err)
	}
	x.Close()
	if s, _ := forger.G4Stats(); s.CorruptBlocks != 1 || s.LoadedBlocks != 0 {
		t.Fatalf("another key's G4 stats: %+v", s)
	}

	plain := newManager(t)
	defer plain.Close()
	if _, err := plain.G4Match(hashes); !errors.Is(err, kvtier.ErrUnsupported) {
		t.Errorf("G4Match without G4: %v", err)
	}
	if _, err := plain.G4Stats(); !errors.Is(err, kvtier.ErrUnsupported) {
		t.Errorf("G4Stats without G4: %v", err)
	}
	bad := cfg
	bad.G4TimeoutUs = 0
	if _, err := kvtier.NewManager(bad); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Errorf("g4_timeout_us 0: %v", err)
	}
}
