package kvtier_test

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

// waiting starts a goroutine in x.Wait(-1) and returns the channel of its outcome, once the
// goroutine has had time to enter the wait.
func waiting(x *kvtier.Transfer) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := x.Wait(-1)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	return done
}

func outcome(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not return")
		return nil
	}
}

func TestCloseDuringWaitCancelsTheWait(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	a := stored(t, m, []uint64{70, 71}, 1)
	f, _ := m.NewFence()
	defer f.Close()
	x, err := m.Offload(a, kvtier.G2, f, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := waiting(x)
	x.Close() // the fence never comes: the waiter must be woken, not left on freed memory
	if err := outcome(t, done); !errors.Is(err, kvtier.ErrCancelled) {
		t.Fatalf("want ErrCancelled, got %v", err)
	}
	if _, err := x.Wait(-1); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("wait after Close: %v", err)
	}
	if g2, _ := m.MatchPrefix([]uint64{70}, kvtier.G2); len(g2) != 0 {
		t.Fatal("a cancelled offload reached G2")
	}
	m.Release(a)
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestCloseRacesWithWaitsOnRunningTransfers(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	for i := uint64(0); i < 40; i++ {
		a := stored(t, m, []uint64{1000 + 2*i, 1001 + 2*i}, byte(i))
		x, err := m.Offload(a, kvtier.G2, nil, i)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for k := range errs {
			wg.Add(1)
			go func(k int) {
				defer wg.Done()
				var n uint64
				n, errs[k] = x.Wait(-1)
				if errs[k] == nil && n != 2 {
					errs[k] = errors.New("moved a wrong number of blocks")
				}
			}(k)
		}
		x.Close()
		wg.Wait()
		for _, err := range errs { // its end, its cancellation, or closed before the wait began
			if err != nil && !errors.Is(err, kvtier.ErrCancelled) && !errors.Is(err, kvtier.ErrInvalidHandle) {
				t.Fatalf("transfer %d: %v", i, err)
			}
		}
		m.Release(a)
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestManagerCloseWakesAWaitingGoroutine(t *testing.T) {
	m := newManager(t)
	a := stored(t, m, []uint64{80}, 1)
	f, _ := m.NewFence()
	x, err := m.Offload(a, kvtier.G2, f, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := waiting(x)
	m.Close()
	if err := outcome(t, done); !errors.Is(err, kvtier.ErrCancelled) {
		t.Fatalf("want ErrCancelled, got %v", err)
	}
	x.Close()
	f.Close()
}

func TestTimeoutReportsTheTimeoutNotAnOlderFailure(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	a := stored(t, m, []uint64{90}, 1)
	f, _ := m.NewFence()
	defer f.Close()
	x, err := m.Offload(a, kvtier.G2, f, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	runtime.LockOSThread() // both calls on one thread: kvt_last_error is per thread
	defer runtime.UnlockOSThread()
	var older, timeout *kvtier.Error
	if _, err := m.Alloc(100000, kvtier.G1); !errors.As(err, &older) {
		t.Fatalf("alloc: %v", err)
	}
	_, err = x.Wait(1e6)
	if !errors.As(err, &timeout) || timeout.Status != kvtier.StatusTimeout {
		t.Fatalf("wait: %v", err)
	}
	if strings.Contains(timeout.Message, older.Message) || !strings.Contains(timeout.Message, "1ms") {
		t.Fatalf("the timeout says %q", timeout.Message)
	}
}
