package kvtier_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

// staleG3File leaves a G3 file as a process that died with its manager would.
func staleG3File(t *testing.T, dir string) string {
	path := filepath.Join(dir, "kvtier-g3-999999-00000000deadbeef.bin")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func withG3(t *testing.T, dir string) {
	cfg := testConfig()
	cfg.G3Blocks, cfg.G3Path = 4, dir
	m, err := kvtier.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
}

func TestLogHandlerGetsTheLibrarysMessages(t *testing.T) {
	var mu sync.Mutex
	var got []string
	kvtier.SetLogHandler(kvtier.LogInfo, func(level kvtier.LogLevel, message string) {
		mu.Lock()
		defer mu.Unlock()
		if level == kvtier.LogInfo {
			got = append(got, message)
		}
	})
	defer kvtier.SetLogHandler(kvtier.LogOff, nil)
	dir := t.TempDir()
	path := staleG3File(t, dir)
	withG3(t, dir)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("the stale G3 file is still there")
	}
	mu.Lock()
	if len(got) != 1 || !strings.Contains(got[0], filepath.Base(path)) {
		t.Fatalf("messages: %q", got)
	}
	got = nil
	mu.Unlock()
	kvtier.SetLogHandler(kvtier.LogWarn, func(_ kvtier.LogLevel, message string) { got = append(got, message) })
	staleG3File(t, dir)
	withG3(t, dir) // INFO is above WARN: not sent
	kvtier.SetLogHandler(kvtier.LogOff, nil)
	staleG3File(t, dir)
	withG3(t, dir)
	if len(got) != 0 {
		t.Fatalf("messages above the level, or after turning it off: %q", got)
	}
}
