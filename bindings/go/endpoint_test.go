package kvtier_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

// ask sends one request line and decodes the reply line.
func ask(t *testing.T, r *bufio.Reader, conn net.Conn, request string) map[string]any {
	t.Helper()
	if _, err := conn.Write([]byte(request + "\n")); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("%s: %v", request, err)
	}
	var reply map[string]any
	if err := json.Unmarshal([]byte(line), &reply); err != nil {
		t.Fatalf("%s: %v in %q", request, err, line)
	}
	return reply
}

// until polls cond, a condition another thread makes true, for up to 10 s.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}

func endpointStats(t *testing.T, e *kvtier.Endpoint) kvtier.EndpointStats {
	t.Helper()
	s, err := e.Stats()
	must(t, err)
	return s
}

// An endpoint over a manager and its connector: a client's requests are answered from
// them, the stats count the client while it is connected, and Close removes the socket.
func TestEndpointServesAndCountsAClient(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	c := schedulerOver(t, m)
	defer c.Close()
	if _, _, err := c.GetNumNewMatchedTokens("r1", tokenRange(8), 0); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "e.sock")
	e, err := m.OpenEndpoint(sock, c)
	must(t, err)
	if s := endpointStats(t, e); s != (kvtier.EndpointStats{}) {
		t.Fatalf("stats before a client: %+v", s)
	}
	if _, err := m.OpenEndpoint(sock, nil); !errors.Is(err, kvtier.ErrState) {
		t.Fatalf("a second endpoint on a live one's socket: %v", err)
	}
	conn, err := net.Dial("unix", sock)
	must(t, err)
	r := bufio.NewReader(conn)
	reply := ask(t, r, conn, `{"cmd":"slots"}`)
	slots, _ := reply["slots"].([]any)
	if reply["ok"] != true || len(slots) != 1 || slots[0].(map[string]any)["req_id"] != "r1" {
		t.Fatalf("slots: %v", reply)
	}
	if reply := ask(t, r, conn, `{"cmd":"nonsense"}`); reply["ok"] != false || reply["error"] == nil {
		t.Fatalf("a bad command: %v", reply)
	}
	if s := endpointStats(t, e); s.Clients != 1 || s.PeakBufferedBytes == 0 {
		t.Fatalf("stats with a client: %+v", s)
	}
	conn.Close()
	until(t, "the client leaves", func() bool { return endpointStats(t, e).Clients == 0 })
	must(t, e.Close())
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("the socket outlived the endpoint: %v", err)
	}
	if _, err := e.Stats(); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("stats of a closed endpoint: %v", err)
	}
	must(t, e.Close())

	// The connector's Close closes the endpoints serving it first.
	e, err = m.OpenEndpoint(sock, c)
	must(t, err)
	must(t, c.Close())
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("the socket outlived its connector: %v", err)
	}
	if _, err := m.OpenEndpoint(sock, c); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("an endpoint for a closed connector: %v", err)
	}
	must(t, e.Close())
}

// EndpointConfig: the defaults; a group or a user let in widen the socket's mode; a client
// beyond MaxClients is told so and counted; bad limits are refused.
func TestEndpointConfig(t *testing.T) {
	if d := kvtier.DefaultEndpointConfig(); d != (kvtier.EndpointConfig{MaxClients: 64, AllowUID: -1,
		AllowGID: -1, ClientBufferBytes: 256 << 10}) {
		t.Fatalf("defaults: %+v", d)
	}
	m := newManager(t)
	defer m.Close()
	sock := filepath.Join(t.TempDir(), "e.sock")
	cfg := kvtier.DefaultEndpointConfig()
	cfg.MaxClients, cfg.AllowGID, cfg.ClientBufferBytes = 1, int64(os.Getgid()), 4096
	e, err := m.OpenEndpointWith(sock, nil, cfg)
	must(t, err)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket with a group let in: %v %v", fi.Mode(), err)
	}
	first, err := net.Dial("unix", sock)
	must(t, err)
	defer first.Close()
	r := bufio.NewReader(first)
	if reply := ask(t, r, first, `{"cmd":"tiers"}`); reply["ok"] != true {
		t.Fatalf("tiers: %v", reply)
	}
	second, err := net.Dial("unix", sock)
	must(t, err)
	defer second.Close()
	line, _ := bufio.NewReader(second).ReadString('\n')
	if !strings.Contains(line, "too many clients (1)") {
		t.Fatalf("the second client was told %q", line)
	}
	until(t, "the refusal is counted", func() bool { return endpointStats(t, e).Refused == 1 })
	if s := endpointStats(t, e); s.Clients != 1 {
		t.Fatalf("stats: %+v", s)
	}
	must(t, e.Close())

	cfg = kvtier.DefaultEndpointConfig()
	cfg.AllowUID = int64(os.Getuid())
	e, err = m.OpenEndpointWith(sock, nil, cfg)
	must(t, err)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o666 {
		t.Fatalf("socket with a user let in: %v %v", fi.Mode(), err)
	}
	m.Close() // closes the endpoint first
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("the socket outlived its manager: %v", err)
	}
	must(t, e.Close())

	m = newManager(t)
	defer m.Close()
	for _, bad := range []kvtier.EndpointConfig{{MaxClients: 0, AllowUID: -1, AllowGID: -1, ClientBufferBytes: 4096},
		{MaxClients: 1, AllowUID: -1, AllowGID: -1, ClientBufferBytes: 100}} {
		if _, err := m.OpenEndpointWith(sock, nil, bad); !errors.Is(err, kvtier.ErrInvalidArgument) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}
