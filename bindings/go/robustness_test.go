package kvtier_test

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

// within fails the test unless f returns within 10 s (a bound on a hang, not a wait).
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still blocked after 10 s", what)
	}
}

// Waits, the transfer's Close and the manager's Close, all at once: a waiter counted by the
// transfer's Close must not then queue for the manager's lock behind the manager's Close.
func TestTransferWaitCloseAndManagerCloseDoNotDeadlock(t *testing.T) {
	for i := 0; i < 300; i++ {
		m := newManager(t)
		a := stored(t, m, []uint64{7000 + uint64(i)}, 1)
		f, err := m.NewFence()
		must(t, err)
		x, err := m.Offload(a, kvtier.G2, f, 0)
		must(t, err)
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, 8)
		for k := 0; k < 8; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, err := x.Wait(-1); err != nil && !errors.Is(err, kvtier.ErrCancelled) &&
					!errors.Is(err, kvtier.ErrInvalidHandle) {
					errs <- err
				}
			}()
		}
		wg.Add(2)
		go func() { defer wg.Done(); <-start; x.Close() }()
		go func() { defer wg.Done(); <-start; m.Close() }()
		close(start)
		within(t, "Wait, Transfer.Close and Manager.Close", wg.Wait)
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", i, err)
		}
		f.Close()
	}
}

// pauseMs is how long the tests' pauses last unresumed: beyond within's bound, so that a
// Close that waits for the pause to end fails, and short enough that the test's cleanup then
// ends.
const pauseMs = 30 * 1000

// pausedCall starts a scheduler call that a breakpoint pauses, and returns once it is
// paused, with the channel of its outcome.
func pausedCall(t *testing.T, m *kvtier.Manager) (*kvtier.Connector, <-chan error) {
	t.Helper()
	cfg := kvtier.DefaultConnectorConfig()
	cfg.Role, cfg.NumGPUBlocks, cfg.PauseTimeoutMs = kvtier.RoleScheduler, 8, pauseMs
	c, err := m.NewConnector(cfg)
	must(t, err)
	_, err = c.AddBreakpoint(kvtier.SlotInitialized, "p")
	must(t, err)
	done := make(chan error, 1)
	go func() {
		_, _, err := c.GetNumNewMatchedTokens("p", tokenRange(8), 0)
		done <- err
	}()
	if p, err := c.WaitPaused(10 * time.Second); err != nil || p.ReqID != "p" {
		t.Fatalf("paused at %+v: %v", p, err)
	}
	return c, done
}

func TestConnectorCloseLetsAPausedCallGo(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	c, done := pausedCall(t, m)
	within(t, "Connector.Close with a call paused", func() { c.Close() })
	within(t, "the paused call", func() { <-done })
	if _, err := c.Slots(); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("a call after Close: %v", err)
	}
}

func TestManagerCloseLetsAPausedCallGo(t *testing.T) {
	m := newManager(t)
	c, done := pausedCall(t, m)
	within(t, "Manager.Close with a call paused", func() { m.Close() })
	within(t, "the paused call", func() { <-done })
	c.Close()
}

// WaitPaused forever, or for a duration too long to mean anything, ends when Close begins.
func TestCloseEndsWaitPaused(t *testing.T) {
	for _, d := range []time.Duration{-1, 1<<63 - 1} {
		m := newManager(t)
		c := schedulerOver(t, m)
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			close(started)
			_, err := c.WaitPaused(d)
			done <- err
		}()
		<-started
		within(t, "Connector.Close during WaitPaused", func() { c.Close() })
		var err error
		within(t, "WaitPaused", func() { err = <-done })
		if !errors.Is(err, kvtier.ErrInvalidHandle) {
			t.Fatalf("WaitPaused(%v) across Close: %v", d, err)
		}
		m.Close()
	}
}

// A scheduler call paused at a breakpoint holds the scheduler half up, not the worker's.
func TestGetFinishedRunsWhileBuildConnectorMetaIsPaused(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	cfg := kvtier.DefaultConnectorConfig()
	cfg.Role, cfg.NumGPUBlocks, cfg.PauseTimeoutMs = kvtier.RoleBoth, 8, pauseMs
	c, err := m.NewConnector(cfg)
	must(t, err)
	defer c.Close()
	must(t, c.Pause())
	done := make(chan error, 1)
	go func() {
		_, err := c.BuildConnectorMeta(nil)
		done <- err
	}()
	p, err := c.WaitPaused(10 * time.Second)
	if err != nil || p.Trigger != kvtier.TriggerBuildConnectorMeta {
		t.Fatalf("paused at %+v: %v", p, err)
	}
	within(t, "GetFinished while BuildConnectorMeta is paused", func() {
		if _, err := c.GetFinished(); err != nil {
			t.Errorf("GetFinished: %v", err)
		}
	})
	must(t, c.Resume())
	must(t, <-done)
}

// A panicking hook is stopped in its trampoline: the call goes on, the connector's lock is
// free for the next call, and the log handler hears of it.
func TestAPanickingHookDoesNotUnwindIntoTheLibrary(t *testing.T) {
	var mu sync.Mutex
	var logged []string
	kvtier.SetLogHandler(kvtier.LogError, func(_ kvtier.LogLevel, message string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, message)
	})
	defer kvtier.SetLogHandler(kvtier.LogOff, nil)
	m := newManager(t)
	defer m.Close()
	c := schedulerOver(t, m)
	defer c.Close()
	must(t, c.SetHooks(&kvtier.Hooks{
		WillCall:     func(kvtier.Trigger, string) { panic("will call") },
		FinishedCall: func(kvtier.Trigger, string, kvtier.Status) { panic("finished call") },
		Transition:   func(string, kvtier.SlotState, kvtier.SlotState, kvtier.Trigger) { panic("transition") },
	}))
	within(t, "calls with panicking hooks", func() {
		_, _, err := c.GetNumNewMatchedTokens("h", tokenRange(8), 0)
		must(t, err)
		must(t, c.UpdateStateAfterAlloc("h", []uint32{0, 1}, 0))
		st, _, err := c.SlotState("h")
		must(t, err)
		if st != kvtier.SlotInitialized {
			t.Errorf("h is %v", st)
		}
	})
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{"will call", "finished call", "transition"} {
		found := false
		for _, l := range logged {
			found = found || strings.Contains(l, "panicked: "+want)
		}
		if !found {
			t.Errorf("no log of the %q panic in %q", want, logged)
		}
	}
}

// A panicking log handler is stopped in its trampoline; the library goes on.
func TestAPanickingLogHandlerDoesNotUnwindIntoTheLibrary(t *testing.T) {
	var calls atomic.Int32
	kvtier.SetLogHandler(kvtier.LogInfo, func(kvtier.LogLevel, string) {
		calls.Add(1)
		panic("log handler")
	})
	defer kvtier.SetLogHandler(kvtier.LogOff, nil)
	dir := t.TempDir()
	within(t, "managers with a panicking log handler", func() {
		for i := 0; i < 2; i++ {
			path := staleG3File(t, dir)
			withG3(t, dir) // logs the stale file's removal
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("the stale G3 file is still there")
			}
		}
	})
	if n := calls.Load(); n != 2 {
		t.Fatalf("the handler ran %d times", n)
	}
}

// A string holding a NUL byte is refused, not cut short at it.
func TestStringsWithANULByteAreRefused(t *testing.T) {
	dir := t.TempDir()
	nul := func(s string) string { return s + "\x00rest" }
	refused := func(what string, err error) {
		t.Helper()
		var e *kvtier.Error
		if !errors.Is(err, kvtier.ErrInvalidArgument) || !errors.As(err, &e) ||
			!strings.Contains(e.Message, what) || !strings.Contains(e.Message, "NUL") {
			t.Errorf("%s with a NUL byte: %v", what, err)
		}
	}
	fields := map[string]func(*kvtier.Config){
		"G3Path":                 func(c *kvtier.Config) { c.G3Blocks, c.G3Path = 4, nul(dir) },
		"G3KeyEnv":               func(c *kvtier.Config) { c.G3KeyEnv = nul("KVTIER_NO_SUCH_VAR") },
		"KVEventsEndpoint":       func(c *kvtier.Config) { c.KVEventsEndpoint = nul("") },
		"KVEventsReplayEndpoint": func(c *kvtier.Config) { c.KVEventsReplayEndpoint = nul("") },
		"KVEventsTopic":          func(c *kvtier.Config) { c.KVEventsTopic = nul("kv") },
		"G4URL":                  func(c *kvtier.Config) { c.G4URL = nul("") },
		"G4PasswordEnv":          func(c *kvtier.Config) { c.G4PasswordEnv = nul("X") },
		"G4KeyPrefix":            func(c *kvtier.Config) { c.G4KeyPrefix = nul("p") },
		"G4KeyEnv":               func(c *kvtier.Config) { c.G4KeyEnv = nul("X") },
	}
	for name, set := range fields {
		cfg := testConfig()
		set(&cfg)
		m, err := kvtier.NewManager(cfg)
		if err == nil {
			m.Close()
		}
		refused(name, err)
	}

	m := newManager(t)
	defer m.Close()
	cfg := kvtier.DefaultConnectorConfig()
	cfg.Role, cfg.NumGPUBlocks = kvtier.RoleScheduler, 8
	cfg.EndpointPath = nul(filepath.Join(dir, "c.sock"))
	c, err := m.NewConnector(cfg)
	if err == nil {
		c.Close()
	}
	refused("EndpointPath", err)
	c = schedulerOver(t, m)
	defer c.Close()
	e, err := m.OpenEndpoint(nul(filepath.Join(dir, "e.sock")), nil)
	if err == nil {
		e.Close()
	}
	refused("path", err)
	log := filepath.Join(dir, "run.kvtlog")
	err = m.RecorderOpen(nul(log))
	if err == nil {
		m.RecorderClose()
	}
	refused("path", err)
	must(t, m.RecorderRing(16))
	refused("path", m.RecorderDump(nul(log)))
	must(t, m.RecorderDump(log))
	_, err = c.Rerun(nul(log))
	refused("path", err)
	_, err = kvtier.ReplayEventLog(nil, nul(log))
	refused("path", err)
	_, _, _, err = kvtier.ReadEventLog(nul(log))
	refused("path", err)
	_, _, err = c.GetNumNewMatchedTokens(nul("r"), tokenRange(4), 0)
	refused("request id", err)
}

// MetricsText returns every status, and a whole text however the counters move meanwhile.
func TestMetricsTextAndTryHashSalt(t *testing.T) {
	m := newManager(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			m.Release(stored(t, m, []uint64{9000 + i%32}, 1))
		}
	}()
	for i := 0; i < 200; i++ {
		text, err := m.MetricsText()
		if err != nil || !strings.HasSuffix(text, "\n") || !strings.Contains(text, "kvtier_tier_blocks") {
			t.Fatalf("metrics text %q: %v", text, err)
		}
	}
	close(stop)
	wg.Wait()
	m.Close()
	if _, err := m.MetricsText(); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("metrics of a closed manager: %v", err)
	}

	for _, salt := range [][]byte{nil, []byte("model")} {
		h, err := kvtier.TryHashSalt(salt)
		if err != nil || h != kvtier.HashSalt(salt) || h == 0 {
			t.Fatalf("TryHashSalt(%q) = %#x, %v; HashSalt gives %#x", salt, h, err, kvtier.HashSalt(salt))
		}
	}
}

// A subscription nobody closes is closed by its finalizer: its eventfd goes away.
func TestAnUnclosedSubscriptionIsFinalized(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	fd := func() int {
		s, err := m.Subscribe(16)
		must(t, err)
		return s.FD()
	}()
	open := func() bool {
		_, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
		return errno == 0
	}
	if !open() {
		t.Fatal("the subscription's fd is not open")
	}
	until(t, "the subscription's finalizer", func() bool {
		runtime.GC()
		return !open()
	})
}
