package kvtier_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

func schedulerOver(t *testing.T, m *kvtier.Manager) *kvtier.Connector {
	t.Helper()
	cfg := kvtier.DefaultConnectorConfig()
	cfg.Role, cfg.NumGPUBlocks = kvtier.RoleScheduler, 8
	c, err := m.NewConnector(cfg)
	must(t, err)
	return c
}

func tokenRange(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(500 + i)
	}
	return out
}

// A request's slot and its store batch as the inspection calls list them, and the hooks'
// record of the calls and transitions that made them.
func TestConnectorSlotsBatchesAndHooks(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	c := schedulerOver(t, m)
	defer c.Close()
	var record []string
	must(t, c.SetHooks(&kvtier.Hooks{
		WillCall: func(tr kvtier.Trigger, id string) { record = append(record, fmt.Sprintf("will %v %q", tr, id)) },
		FinishedCall: func(tr kvtier.Trigger, id string, s kvtier.Status) {
			record = append(record, fmt.Sprintf("done %v %q %v", tr, id, s))
		},
		Transition: func(id string, from, to kvtier.SlotState, tr kvtier.Trigger) {
			record = append(record, fmt.Sprintf("%q %v -> %v by %v", id, from, to, tr))
		},
	}))
	if n, _, err := c.GetNumNewMatchedTokens("a", tokenRange(16), 0); err != nil || n != 0 {
		t.Fatalf("match: %d, %v", n, err)
	}
	must(t, c.UpdateStateAfterAlloc("a", []uint32{0, 1, 2, 3}, 0))
	want := []string{
		`will GET_NUM_NEW_MATCHED_TOKENS "a"`,
		`"a" KVT_SLOT_UNKNOWN -> KVT_SLOT_INITIALIZED by GET_NUM_NEW_MATCHED_TOKENS`,
		`done GET_NUM_NEW_MATCHED_TOKENS "a" KVT_OK`,
		`will UPDATE_STATE_AFTER_ALLOC "a"`,
		`done UPDATE_STATE_AFTER_ALLOC "a" KVT_OK`,
	}
	if !reflect.DeepEqual(record, want) {
		t.Fatalf("hooks saw\n%q\nwant\n%q", record, want)
	}
	slots, err := c.Slots()
	if err != nil || len(slots) != 1 || slots[0].ReqID != "a" || slots[0].State != kvtier.SlotInitialized ||
		slots[0].Tokens != 16 || slots[0].Age <= 0 {
		t.Fatalf("slots: %+v (%v)", slots, err)
	}
	if b, err := c.Batches(); err != nil || len(b) != 0 {
		t.Fatalf("batches before the step: %+v (%v)", b, err)
	}
	record = nil
	_, err = c.BuildConnectorMeta([]kvtier.ScheduledRequest{{ReqID: "a", NumScheduledTokens: 16}})
	must(t, err)
	want = []string{
		`will BUILD_CONNECTOR_META ""`,
		`"a" KVT_SLOT_INITIALIZED -> KVT_SLOT_PREFILLING by BUILD_CONNECTOR_META`,
		`done BUILD_CONNECTOR_META "" KVT_OK`,
	}
	if !reflect.DeepEqual(record, want) {
		t.Fatalf("hooks saw\n%q\nwant\n%q", record, want)
	}
	batches, err := c.Batches()
	if err != nil || len(batches) != 1 || batches[0].ReqID != "a" || batches[0].Src != kvtier.G1 ||
		batches[0].Dst != kvtier.G2 || batches[0].Blocks != 4 || batches[0].Step != 1 || batches[0].Batch == 0 {
		t.Fatalf("batches: %+v (%v)", batches, err)
	}
	slots, _ = c.Slots()
	if len(slots) != 1 || slots[0].State != kvtier.SlotPrefilling || slots[0].Computed != 16 ||
		slots[0].Blocks != 4 || slots[0].Batches != 1 {
		t.Fatalf("slots after the step: %+v", slots)
	}
	must(t, c.SetHooks(nil))
	record = nil
	if _, err := c.RequestFinished("a"); err != nil || len(record) != 0 {
		t.Fatalf("finish without hooks: %v, hooks saw %q", err, record)
	}
}

// The matched tokens capped by GetNumNewMatchedTokensMax, over blocks registered in G2 under
// a request's own salt.
func TestGetNumNewMatchedTokensMaxCapsTheHit(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	c := schedulerOver(t, m)
	defer c.Close()
	salt := kvtier.HashSalt([]byte("tenant"))
	tokens := tokenRange(17)
	hashes, err := kvtier.HashSequence(tokens, 4, salt)
	must(t, err)
	g2, err := m.Alloc(len(hashes), kvtier.G2)
	must(t, err)
	g2, err = m.RegisterHashes(g2, hashes, 0)
	must(t, err)
	must(t, m.Release(g2))
	for _, tc := range []struct{ max, want uint64 }{{100, 16}, {16, 16}, {11, 8}, {3, 0}} {
		n, async, err := c.GetNumNewMatchedTokensMax("r", salt, tokens, 0, tc.max)
		if err != nil || n != tc.want || async {
			t.Errorf("cap %d: %d tokens (async %v), %v; want %d", tc.max, n, async, err, tc.want)
		}
	}
	if n, _, err := c.GetNumNewMatchedTokens("s", tokens, 0); err != nil || n != 0 {
		t.Errorf("under the config's salt: %d, %v", n, err)
	}
}

// A breakpoint pauses a scheduler call where it says; WaitPaused tells where, the
// inspection calls answer meanwhile, Resume lets it go. Pause pauses the next call; a pause
// nobody resumes ends after the pause timeout.
func TestBreakpointsPauseAndResume(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	c := schedulerOver(t, m)
	defer c.Close()
	if _, err := c.WaitPaused(0); !errors.Is(err, kvtier.ErrTimeout) {
		t.Fatalf("nothing paused: %v", err)
	}
	if err := c.Resume(); !errors.Is(err, kvtier.ErrState) {
		t.Fatalf("resume with nothing paused: %v", err)
	}
	if _, err := c.AddBreakpoint(kvtier.SlotState(99), ""); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("a breakpoint on state 99: %v", err)
	}
	id, err := c.AddBreakpoint(kvtier.SlotInitialized, "b")
	must(t, err)
	done := make(chan error, 1)
	go func() {
		_, _, err := c.GetNumNewMatchedTokens("b", tokenRange(8), 0)
		done <- err
	}()
	p, err := c.WaitPaused(10 * time.Second)
	want := kvtier.PauseInfo{Trigger: kvtier.TriggerGetNumNewMatchedTokens, State: kvtier.SlotInitialized,
		Breakpoint: id, Pauses: 1, ReqID: "b"}
	if err != nil || p != want {
		t.Fatalf("paused at %+v (%v), want %+v", p, err, want)
	}
	if s, err := c.Slots(); err != nil || len(s) != 1 || s[0].ReqID != "b" || s[0].State != kvtier.SlotInitialized {
		t.Fatalf("slots at the pause: %+v (%v)", s, err)
	}
	must(t, c.Resume())
	must(t, <-done)
	must(t, c.RemoveBreakpoint(id))
	if err := c.RemoveBreakpoint(id); !errors.Is(err, kvtier.ErrNotFound) {
		t.Fatalf("removing it twice: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.WaitPausedContext(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitPausedContext with nothing paused: %v", err)
	}
	must(t, c.Pause())
	go func() { done <- c.RequestPreempted("b") }()
	p, err = c.WaitPausedContext(context.Background())
	if err != nil || p.Breakpoint != 0 || p.Trigger != kvtier.TriggerRequestPreempted || p.Pauses != 2 {
		t.Fatalf("paused by Pause at %+v (%v)", p, err)
	}
	must(t, c.Resume())
	must(t, <-done)
	if st, _, _ := c.SlotState("b"); st != kvtier.SlotPreempted {
		t.Fatalf("b is %v", st)
	}

	for _, bad := range []time.Duration{0, 2 * time.Hour, -time.Second} {
		if err := c.SetPauseTimeout(bad); !errors.Is(err, kvtier.ErrInvalidArgument) {
			t.Fatalf("pause timeout %v: %v", bad, err)
		}
	}
	must(t, c.SetPauseTimeout(time.Millisecond))
	must(t, c.Pause())
	must(t, c.RequestPreempted("b")) // nobody resumes: the pause ends itself
}
