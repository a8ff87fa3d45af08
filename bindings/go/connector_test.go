package kvtier_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	kvtier "github.com/kvtier/kvtier/bindings/go"
	"github.com/kvtier/kvtier/bindings/go/internal/seed003"
)

// transcriptFile is the transcript of seed 003 through the connector, as every language
// prints it.
const transcriptFile = "../../examples/connector/seed003.txt"

func checkTranscript(t *testing.T, lines []string) {
	t.Helper()
	want, err := os.ReadFile(transcriptFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(lines, "\n") + "\n"; got != string(want) {
		t.Fatalf("transcript:\n%swant:\n%s", got, want)
	}
}

// Run with workerEnv set, the test binary is the worker process of the two-process test: it
// reads commands as length-prefixed frames on stdin and answers on stdout.
const workerEnv = "KVTIER_TEST_CONNECTOR_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		if err := workerMain(os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Frames: a uint32 length (little-endian), then that many bytes. A command's first byte
// names it; an answer's is 0 and the result, or 1, the status (int32) and the message.
const (
	cmdStep     = 'S'
	cmdFinished = 'F'
	cmdClear    = 'C'
)

func writeFrame(w io.Writer, b []byte) error {
	if err := binary.Write(w, binary.LittleEndian, uint32(len(b))); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}

func readFrame(r io.Reader) ([]byte, error) {
	var n uint32
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return nil, err
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return b, err
}

type enc struct{ bytes.Buffer }

func (e *enc) u32(v uint32) *enc { binary.Write(&e.Buffer, binary.LittleEndian, v); return e }
func (e *enc) u64(v uint64) *enc { binary.Write(&e.Buffer, binary.LittleEndian, v); return e }
func (e *enc) bytes(b []byte) *enc {
	e.u32(uint32(len(b)))
	e.Write(b)
	return e
}
func (e *enc) strs(v []string) *enc {
	e.u32(uint32(len(v)))
	for _, s := range v {
		e.bytes([]byte(s))
	}
	return e
}

type dec struct{ *bytes.Reader }

func (d dec) u32() (v uint32) { binary.Read(d, binary.LittleEndian, &v); return }
func (d dec) u64() (v uint64) { binary.Read(d, binary.LittleEndian, &v); return }
func (d dec) bytes() []byte {
	b := make([]byte, d.u32())
	io.ReadFull(d, b)
	return b
}
func (d dec) strs() []string {
	out := make([]string, d.u32())
	for i := range out {
		out[i] = string(d.bytes())
	}
	return out
}

// workerMain is the worker process: a RoleWorker connector over its own manager and G1.
func workerMain(in io.Reader, out io.Writer) error {
	g1, err := seed003.NewG1()
	if err != nil {
		return err
	}
	defer g1.Close()
	m, err := kvtier.NewManager(seed003.ManagerConfig())
	if err != nil {
		return err
	}
	defer m.Close()
	c, err := m.NewConnector(seed003.ConnectorConfig(kvtier.RoleWorker))
	if err != nil {
		return err
	}
	if err := c.RegisterKVCaches(g1.Layout(), seed003.GPUBlocks); err != nil {
		return err
	}
	in = bufio.NewReader(in)
	for {
		frame, err := readFrame(in)
		if err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		d := dec{bytes.NewReader(frame[1:])}
		var answer enc
		switch frame[0] {
		case cmdStep:
			meta := d.bytes()
			writes := make([]seed003.Write, d.u32())
			for i := range writes {
				writes[i] = seed003.Write{B: d.u32(), Hash: d.u64()}
			}
			same := make([]seed003.Pair, d.u32())
			for i := range same {
				same[i] = seed003.Pair{A: d.u32(), B: d.u32()}
			}
			var n int
			n, err = seed003.WorkerStep(c, g1, meta, writes, same)
			answer.u32(uint32(n))
		case cmdFinished:
			var f kvtier.Finished
			f, err = c.GetFinished()
			answer.strs(f.FinishedSending).strs(f.FinishedRecving).u32(uint32(len(f.LoadErrorBlockIDs)))
			for _, b := range f.LoadErrorBlockIDs {
				answer.u32(b)
			}
			answer.bytes(f.Report)
		case cmdClear:
			err = c.ClearConnectorMetadata()
		default:
			return errors.New("unknown command")
		}
		reply := append([]byte{0}, answer.Bytes()...)
		var e *kvtier.Error
		if errors.As(err, &e) {
			reply = append([]byte{1}, new(enc).u32(uint32(e.Status)).bytes([]byte(e.Message)).Bytes()...)
		} else if err != nil {
			return err
		}
		if err := writeFrame(out, reply); err != nil {
			return err
		}
	}
}

// remoteWorker is the worker half in a child process: this test binary, run again.
type remoteWorker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func spawnWorker(t *testing.T) *remoteWorker {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), workerEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return &remoteWorker{cmd, in, bufio.NewReader(out)}
}

// Close ends the worker's input; the worker exits.
func (w *remoteWorker) Close() error {
	w.in.Close()
	return w.cmd.Wait()
}

func (w *remoteWorker) call(command []byte) (dec, error) {
	if err := writeFrame(w.in, command); err != nil {
		return dec{}, err
	}
	reply, err := readFrame(w.out)
	if err != nil {
		return dec{}, err
	}
	d := dec{bytes.NewReader(reply[1:])}
	if reply[0] != 0 {
		return d, &kvtier.Error{Status: kvtier.Status(int32(d.u32())), Message: string(d.bytes())}
	}
	return d, nil
}

func (w *remoteWorker) Step(meta []byte, writes []seed003.Write, same []seed003.Pair) (int, error) {
	e := new(enc)
	e.WriteByte(cmdStep)
	e.bytes(meta).u32(uint32(len(writes)))
	for _, x := range writes {
		e.u32(x.B).u64(x.Hash)
	}
	e.u32(uint32(len(same)))
	for _, p := range same {
		e.u32(p.A).u32(p.B)
	}
	d, err := w.call(e.Bytes())
	if err != nil {
		return 0, err
	}
	return int(d.u32()), nil
}

func (w *remoteWorker) GetFinished() (kvtier.Finished, error) {
	d, err := w.call([]byte{cmdFinished})
	if err != nil {
		return kvtier.Finished{}, err
	}
	f := kvtier.Finished{FinishedSending: d.strs(), FinishedRecving: d.strs()}
	f.LoadErrorBlockIDs = make([]uint32, d.u32())
	for i := range f.LoadErrorBlockIDs {
		f.LoadErrorBlockIDs[i] = d.u32()
	}
	f.Report = d.bytes()
	return f, nil
}

func (w *remoteWorker) Clear() error {
	_, err := w.call([]byte{cmdClear})
	return err
}

func (w *remoteWorker) SharesManager() bool { return false }

// checkScheduler checks what both forms of the scenario leave behind in the scheduler: the
// transitions of its requests (A, B, and V in two processes), and B's three blocks
// registered in G2 (BLOCK_STORED events).
func checkScheduler(t *testing.T, m *kvtier.Manager, c *kvtier.Connector, requests uint64) {
	t.Helper()
	s, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	tr := s.Transitions
	if tr[0][kvtier.SlotInitialized] != requests ||
		tr[kvtier.SlotOnboardStaged][kvtier.SlotOnboarding] != requests-1 ||
		tr[kvtier.SlotPrefilling][kvtier.SlotFinishing] != requests-1 ||
		tr[kvtier.SlotPrefilling][kvtier.SlotDecoding] != 1 || tr[kvtier.SlotDecoding][kvtier.SlotFinishing] != 1 ||
		tr[kvtier.SlotFinishing][kvtier.SlotFinished] != requests {
		t.Errorf("transitions: %v", tr)
	}
	if s.StoredBlocks != 3 || s.StoreFailures != 0 || s.LoadErrors != 0 || s.Preemptions != 0 {
		t.Errorf("stats: %+v", s)
	}
	events, err := c.TakeEvents(64)
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for _, e := range events {
		if e.Type == kvtier.EventBlockStored && e.Tier == kvtier.G2 {
			stored++
		}
	}
	if stored != 3 {
		t.Errorf("%d BLOCK_STORED events in G2, want 3: %+v", stored, events)
	}
	if err := m.Check(); err != nil {
		t.Error(err)
	}
}

func TestConnectorSeed003InOneProcess(t *testing.T) {
	g1, err := seed003.NewG1()
	if err != nil {
		t.Fatal(err)
	}
	defer g1.Close()
	m, err := kvtier.NewManager(seed003.ManagerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := m.NewConnector(seed003.ConnectorConfig(kvtier.RoleBoth))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.RegisterKVCaches(g1.Layout(), seed003.GPUBlocks); err != nil {
		t.Fatal(err)
	}
	lines, err := seed003.Run(m, c, seed003.LocalWorker{C: c, G1: g1})
	if err != nil {
		t.Fatal(err)
	}
	checkTranscript(t, lines)
	if s, _ := c.Stats(); s.LoadedBlocks != 2 {
		t.Errorf("loaded %d blocks, want 2", s.LoadedBlocks)
	}
	checkScheduler(t, m, c, 2)
	// B's tokens: its three blocks under the connector's salt, none under a tenant's; none
	// after a reset.
	var b []uint32
	for i := uint32(0); i < 32; i++ {
		b = append(b, 1000+i)
	}
	for i := uint32(0); i < 20; i++ {
		b = append(b, 2000+i)
	}
	if n, _, err := c.GetNumNewMatchedTokensSalted("T", kvtier.HashSalt([]byte("tenant-1")), b, 0); err != nil || n != 0 {
		t.Errorf("a tenant's match: %d tokens, %v; want 0", n, err)
	}
	if n, _, err := c.GetNumNewMatchedTokens("U", b, 0); err != nil || n != 48 {
		t.Errorf("B's match: %d tokens, %v; want 48", n, err)
	}
	if _, err := c.RequestFinished("U"); err != nil {
		t.Fatal(err)
	}
	if err := c.ResetCache(); err != nil {
		t.Fatal(err)
	}
	if n, _, err := c.GetNumNewMatchedTokens("V", b, 0); err != nil || n != 0 {
		t.Errorf("a match after the reset: %d tokens, %v; want 0", n, err)
	}
}

func TestConnectorSeed003InTwoProcesses(t *testing.T) {
	cfg := seed003.ManagerConfig()
	cfg.ChunkBytes = 0 // the scheduler's manager holds no KV bytes
	m, err := kvtier.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := m.NewConnector(seed003.ConnectorConfig(kvtier.RoleScheduler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := spawnWorker(t)
	defer func() {
		if err := w.Close(); err != nil {
			t.Errorf("the worker process: %v", err)
		}
	}()
	// Metadata that does not decode is refused by the worker, which then goes on.
	if _, err := w.Step([]byte("\x93not metadata"), nil, nil); !errors.Is(err, kvtier.ErrCorrupt) {
		t.Fatalf("corrupt metadata in the worker: %v", err)
	}
	// A scheduler has no worker half.
	if err := c.BindConnectorMetadata(nil); !errors.Is(err, kvtier.ErrState) {
		t.Fatalf("bind on a scheduler: %v", err)
	}
	lines, err := seed003.Run(m, c, w)
	if err != nil {
		t.Fatal(err)
	}
	checkTranscript(t, lines)
	// The check of G2's bytes loaded B's three blocks once more, as request V.
	if s, _ := c.Stats(); s.LoadedBlocks != 5 {
		t.Errorf("loaded %d blocks, want 5", s.LoadedBlocks)
	}
	checkScheduler(t, m, c, 3)
}

func TestConnectorBadInputIsRefusedAndHarmsNothing(t *testing.T) {
	g1, err := seed003.NewG1()
	if err != nil {
		t.Fatal(err)
	}
	defer g1.Close()
	m, err := kvtier.NewManager(seed003.ManagerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := m.NewConnector(seed003.ConnectorConfig(kvtier.RoleBoth))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.RegisterKVCaches(g1.Layout(), seed003.GPUBlocks); err != nil {
		t.Fatal(err)
	}
	want := func(what string, err, target error) {
		t.Helper()
		if !errors.Is(err, target) {
			t.Fatalf("%s: %v, want %v", what, err, target.(*kvtier.Error).Status)
		}
	}
	tokens := make([]uint32, 40)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}

	want("unknown id, update_state_after_alloc", c.UpdateStateAfterAlloc("nobody", []uint32{1}, 0), kvtier.ErrNotFound)
	_, err = c.RequestFinished("nobody")
	want("unknown id, request_finished", err, kvtier.ErrNotFound)
	want("unknown id, request_preempted", c.RequestPreempted("nobody"), kvtier.ErrNotFound)
	_, _, err = c.SlotState("nobody")
	want("unknown id, slot_state", err, kvtier.ErrNotFound)
	_, _, err = c.GetNumNewMatchedTokens("a\x00b", tokens, 0)
	want("an id with a NUL byte", err, kvtier.ErrInvalidArgument)

	if n, async, err := c.GetNumNewMatchedTokens("A", tokens, 0); n != 0 || async || err != nil {
		t.Fatal(n, async, err)
	}
	if err := c.UpdateStateAfterAlloc("A", []uint32{1, 2, 3}, 0); err != nil {
		t.Fatal(err)
	}
	meta, err := c.BuildConnectorMeta([]kvtier.ScheduledRequest{{ReqID: "A", NumScheduledTokens: 40}})
	if err != nil {
		t.Fatal(err)
	}
	want("garbage metadata", c.BindConnectorMetadata([]byte("not msgpack")), kvtier.ErrCorrupt)
	want("truncated metadata", c.BindConnectorMetadata(meta[:len(meta)-1]), kvtier.ErrCorrupt)
	want("empty metadata", c.BindConnectorMetadata(nil), kvtier.ErrCorrupt)
	want("metadata as a report", c.UpdateConnectorOutput(meta), kvtier.ErrCorrupt)
	want("garbage report", c.UpdateConnectorOutput([]byte{0xc1}), kvtier.ErrCorrupt)

	// The request goes on unharmed: its stores run and register.
	h, err := kvtier.HashSequence(tokens, seed003.Page, kvtier.HashSalt(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seed003.WorkerStep(c, g1, meta, []seed003.Write{{B: 1, Hash: h[0]}, {B: 2, Hash: h[1]}}, nil); err != nil {
		t.Fatal(err)
	}
	want("a second bind", c.BindConnectorMetadata(meta), kvtier.ErrState)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		f, err := c.GetFinished()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.UpdateConnectorOutput(f.Report); err != nil {
			t.Fatal(err)
		}
		if s, _ := c.Stats(); s.StoredBlocks == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stores did not end")
		}
	}
	if err := c.ClearConnectorMetadata(); err != nil {
		t.Fatal(err)
	}
	if delay, err := c.RequestFinished("A"); delay || err != nil {
		t.Fatal(delay, err)
	}
	_, err = c.RequestFinished("A")
	want("finished id", err, kvtier.ErrNotFound)
	if s, _, err := c.SlotState("A"); s != kvtier.SlotFinished || err != nil {
		t.Fatal(s, err)
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestManagerCloseClosesItsConnector(t *testing.T) {
	m, err := kvtier.NewManager(seed003.ManagerConfig())
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.NewConnector(seed003.ConnectorConfig(kvtier.RoleScheduler))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.NewConnector(seed003.ConnectorConfig(kvtier.RoleScheduler)); !errors.Is(err, kvtier.ErrState) {
		t.Fatalf("a second connector: %v", err)
	}
	m.Close()
	if _, _, err := c.GetNumNewMatchedTokens("A", []uint32{1}, 0); !errors.Is(err, kvtier.ErrInvalidHandle) {
		t.Fatalf("after the manager's Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// B is preempted after a first chunk of its prefill, comes back, loads A's prefix again into
// other G1 blocks (one of them added by the step, as NewBlockIDs) and finishes.
func TestConnectorPreemptedBLoadsAgainIntoOtherBlocks(t *testing.T) {
	g1, err := seed003.NewG1()
	if err != nil {
		t.Fatal(err)
	}
	defer g1.Close()
	m, err := kvtier.NewManager(seed003.ManagerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := m.NewConnector(seed003.ConnectorConfig(kvtier.RoleBoth))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.RegisterKVCaches(g1.Layout(), seed003.GPUBlocks); err != nil {
		t.Fatal(err)
	}
	w := seed003.LocalWorker{C: c, G1: g1}
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	a, b := make([]uint32, 40), make([]uint32, 52)
	for i := range a {
		a[i] = uint32(1000 + i)
	}
	copy(b, a[:32])
	for i := 32; i < 52; i++ {
		b[i] = uint32(2000 + i - 32)
	}
	ha, err := kvtier.HashSequence(a, seed003.Page, kvtier.HashSalt(nil))
	ok(err)
	hb, err := kvtier.HashSequence(b, seed003.Page, kvtier.HashSalt(nil))
	ok(err)
	matched := func() {
		t.Helper()
		if n, async, err := c.GetNumNewMatchedTokens("B", b, 0); n != 32 || async || err != nil {
			t.Fatal(n, async, err)
		}
	}
	state := func(want kvtier.SlotState) {
		t.Helper()
		if s, _, err := c.SlotState("B"); s != want || err != nil {
			t.Fatalf("B is %v (%v), want %v", s, err, want)
		}
	}

	_, _, err = c.GetNumNewMatchedTokens("A", a, 0)
	ok(err)
	ok(c.UpdateStateAfterAlloc("A", []uint32{1, 2, 3}, 0))
	_, _, err = seed003.EngineStep(c, w, []kvtier.ScheduledRequest{{ReqID: "A", NumScheduledTokens: 40}},
		[]seed003.Write{{B: 1, Hash: ha[0]}, {B: 2, Hash: ha[1]}}, nil, 2, 0)
	ok(err)
	_, err = c.RequestFinished("A")
	ok(err)

	matched()
	ok(c.UpdateStateAfterAlloc("B", []uint32{4, 5, 6, 7}, 32))
	same, _, err := seed003.EngineStep(c, w, []kvtier.ScheduledRequest{{ReqID: "B", NumComputedTokens: 32, NumScheduledTokens: 8}},
		nil, []seed003.Pair{{A: 4, B: 1}, {A: 5, B: 2}}, 2, 2)
	ok(err)
	if same != 2 {
		t.Fatalf("B's first load: %d blocks hold A's bytes", same)
	}
	ok(c.RequestPreempted("B"))
	state(kvtier.SlotPreempted)
	ok(c.HandlePreemptions([]string{"B", "nobody", "A"}))
	for blk := uint32(4); blk < 8; blk++ {
		g1.WriteKV(blk, 0) // the engine reuses B's blocks
	}

	matched()
	state(kvtier.SlotOnboardStaged)
	ok(c.UpdateStateAfterAlloc("B", []uint32{10, 11, 12}, 32))
	same, _, err = seed003.EngineStep(c, w, []kvtier.ScheduledRequest{
		{ReqID: "B", NumComputedTokens: 32, NumScheduledTokens: 20, NewBlockIDs: []uint32{13}}},
		[]seed003.Write{{B: 12, Hash: hb[2]}}, []seed003.Pair{{A: 10, B: 1}, {A: 11, B: 2}}, 3, 4)
	ok(err)
	if same != 2 {
		t.Fatalf("B's second load: %d blocks hold A's bytes", same)
	}
	if delay, err := c.RequestFinished("B"); delay || err != nil {
		t.Fatal(delay, err)
	}
	_, history, err := c.SlotState("B")
	ok(err)
	want := []kvtier.SlotState{kvtier.SlotInitialized, kvtier.SlotOnboardStaged, kvtier.SlotOnboarding,
		kvtier.SlotPrefilling, kvtier.SlotPreempted, kvtier.SlotOnboardStaged, kvtier.SlotOnboarding,
		kvtier.SlotPrefilling, kvtier.SlotFinishing, kvtier.SlotFinished}
	if fmt.Sprint(history) != fmt.Sprint(want) {
		t.Fatalf("B's history %v, want %v", history, want)
	}
	s, err := c.Stats()
	ok(err)
	if s.Preemptions != 1 || s.Transitions[kvtier.SlotPreempted][kvtier.SlotOnboardStaged] != 1 {
		t.Fatalf("stats: %+v", s)
	}
	g2, err := m.MatchPrefix(hb, kvtier.G2)
	ok(err)
	ok(m.Release(g2))
	if len(g2) != 3 {
		t.Fatalf("G2 holds %d of B's blocks, want 3", len(g2))
	}
	ok(m.Check())
}

// goroutineWorker makes the worker half's calls on a goroutine of its own, as an engine
// whose model runner is not its scheduler would.
type goroutineWorker struct {
	seed003.LocalWorker
	calls chan func()
}

func (w goroutineWorker) do(f func()) {
	done := make(chan struct{})
	w.calls <- func() { f(); close(done) }
	<-done
}

func (w goroutineWorker) Step(meta []byte, writes []seed003.Write, same []seed003.Pair) (n int, err error) {
	w.do(func() { n, err = w.LocalWorker.Step(meta, writes, same) })
	return
}

func (w goroutineWorker) GetFinished() (f kvtier.Finished, err error) {
	w.do(func() { f, err = w.LocalWorker.GetFinished() })
	return
}

func (w goroutineWorker) Clear() (err error) {
	w.do(func() { err = w.LocalWorker.Clear() })
	return
}

// The scheduler half on this goroutine, the worker half on another, and a third reading
// the counters and B's state all along: the transcript is seed 003's.
func TestConnectorHalvesOnThreeGoroutines(t *testing.T) {
	g1, err := seed003.NewG1()
	if err != nil {
		t.Fatal(err)
	}
	defer g1.Close()
	m, err := kvtier.NewManager(seed003.ManagerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := m.NewConnector(seed003.ConnectorConfig(kvtier.RoleBoth))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.RegisterKVCaches(g1.Layout(), seed003.GPUBlocks); err != nil {
		t.Fatal(err)
	}
	w := goroutineWorker{seed003.LocalWorker{C: c, G1: g1}, make(chan func())}
	started, stop, stopped := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		for f := range w.calls {
			f()
		}
	}()
	defer close(w.calls)
	go func() {
		defer close(stopped)
		close(started)
		for {
			if _, err := c.Stats(); err != nil {
				t.Error(err)
			}
			if _, _, err := c.SlotState("B"); err != nil && !errors.Is(err, kvtier.ErrNotFound) {
				t.Error(err)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	<-started
	lines, err := seed003.Run(m, c, w)
	close(stop)
	<-stopped
	if err != nil {
		t.Fatal(err)
	}
	checkTranscript(t, lines)
}
