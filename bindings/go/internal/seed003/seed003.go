// Package seed003 is seed 003's scenario through the connector: request A computes two
// blocks that are stored to G2; request B shares A's prefix, loads it from G2 into its own
// G1 blocks and computes the rest. cmd/connector_seed003 prints its transcript, and
// connector_test.go runs it in one process and in two.
package seed003

import (
	"fmt"
	"strings"
	"syscall"
	"time"
	"unsafe"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

const (
	Page      = 16
	Layers    = 2
	Outer     = 2
	Chunk     = 256
	Block     = Chunk * Layers * Outer
	GPUBlocks = 100
)

// ManagerConfig is both processes' manager: the same page size and G2 capacity; its own G1
// is unused.
func ManagerConfig() kvtier.Config {
	c := kvtier.DefaultConfig()
	c.PageSize, c.NumLayers, c.NumOuter, c.ChunkBytes = Page, Layers, Outer, Chunk
	c.G1Blocks, c.G2Blocks, c.G3Blocks = 1, 50, 0
	return c
}

func ConnectorConfig(role kvtier.ConnectorRole) kvtier.ConnectorConfig {
	c := kvtier.DefaultConnectorConfig()
	c.Role, c.Offload, c.StoreTier, c.NumGPUBlocks, c.LoadAsync = role, kvtier.OffloadEager, kvtier.G2, GPUBlocks, false
	return c
}

// KVByte is byte k of the KV of the full block whose sequence hash is h.
func KVByte(h uint64, k int) byte { return byte(h>>(8*(k%8))) ^ byte(k/8) }

// G1 is the engine's G1: GPUBlocks blocks of Block bytes in host memory outside Go's heap;
// block b is bytes [b*Block, (b+1)*Block). Close it after the manager.
type G1 struct{ buf []byte }

func NewG1() (*G1, error) {
	b, err := syscall.Mmap(-1, 0, GPUBlocks*Block, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_ANON|syscall.MAP_PRIVATE)
	return &G1{b}, err
}

func (g *G1) Close() error { return syscall.Munmap(g.buf) }

// Layout is the layout of the connector's RegisterKVCaches.
func (g *G1) Layout() *kvtier.G1Layout {
	l := &kvtier.G1Layout{Memory: kvtier.MemoryHost}
	for i := 0; i < Layers*Outer; i++ {
		l.Bases = append(l.Bases, uintptr(unsafe.Pointer(&g.buf[i*Chunk])))
		l.Strides = append(l.Strides, Block)
	}
	return l
}

func (g *G1) block(b uint32) []byte { return g.buf[int(b)*Block : int(b+1)*Block] }

// WriteKV is the engine's forward: block b gets the KV of hash h.
func (g *G1) WriteKV(b uint32, h uint64) {
	for k, d := 0, g.block(b); k < Block; k++ {
		d[k] = KVByte(h, k)
	}
}

// Same says whether blocks a and b hold the same bytes.
func (g *G1) Same(a, b uint32) bool { return string(g.block(a)) == string(g.block(b)) }

// Write is one block of a step's forward: G1 block B gets the KV of Hash.
type Write struct {
	B    uint32
	Hash uint64
}

// Pair is two G1 blocks that must hold the same bytes once the step's loads ended.
type Pair struct{ A, B uint32 }

// WorkerStep is the worker half of one engine step: load, compare the pairs once loaded,
// forward (write writes), save. It returns how many pairs held the same bytes.
func WorkerStep(c *kvtier.Connector, g *G1, meta []byte, writes []Write, same []Pair) (int, error) {
	if err := c.BindConnectorMetadata(meta); err != nil {
		return 0, err
	}
	if err := c.StartLoadKV(); err != nil {
		return 0, err
	}
	for l := uint32(0); l < Layers; l++ {
		if err := c.WaitForLayerLoad(l); err != nil {
			return 0, err
		}
	}
	matching := 0
	for _, p := range same {
		if g.Same(p.A, p.B) {
			matching++
		}
	}
	for _, w := range writes {
		g.WriteKV(w.B, w.Hash)
	}
	for l := uint32(0); l < Layers; l++ {
		if err := c.SaveKVLayer(l); err != nil {
			return 0, err
		}
	}
	return matching, c.WaitForSave()
}

// Worker is the worker half, in this process or another.
type Worker interface {
	Step(meta []byte, writes []Write, same []Pair) (int, error) // see WorkerStep
	GetFinished() (kvtier.Finished, error)
	Clear() error
	// SharesManager: its G2 is the scheduler's manager's (one process), so that G2's bytes
	// can be read there.
	SharesManager() bool
}

// LocalWorker is the worker half of a RoleBoth connector.
type LocalWorker struct {
	C  *kvtier.Connector
	G1 *G1
}

func (w LocalWorker) Step(meta []byte, writes []Write, same []Pair) (int, error) {
	return WorkerStep(w.C, w.G1, meta, writes, same)
}
func (w LocalWorker) GetFinished() (kvtier.Finished, error) { return w.C.GetFinished() }
func (w LocalWorker) Clear() error                          { return w.C.ClearConnectorMetadata() }
func (w LocalWorker) SharesManager() bool                   { return true }

// EngineStep is one engine step from the scheduler's side: build the metadata, run the worker's
// step, then pass the worker's reports on until the stats show stores and loads (5 s at
// most). It returns the worker's matching pairs and the requests finished receiving.
func EngineStep(sched *kvtier.Connector, w Worker, reqs []kvtier.ScheduledRequest, writes []Write, same []Pair,
	stores, loads uint64) (int, []string, error) {
	meta, err := sched.BuildConnectorMeta(reqs)
	if err != nil {
		return 0, nil, err
	}
	matching, err := w.Step(meta, writes, same)
	if err != nil {
		return 0, nil, err
	}
	var recving []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		f, err := w.GetFinished()
		if err != nil {
			return 0, nil, err
		}
		recving = append(recving, f.FinishedRecving...)
		if err := sched.UpdateConnectorOutput(f.Report); err != nil {
			return 0, nil, err
		}
		s, err := sched.Stats()
		if err != nil {
			return 0, nil, err
		}
		if s.StoredBlocks >= stores && s.LoadedBlocks >= loads {
			break
		}
		if time.Now().After(deadline) {
			return 0, nil, fmt.Errorf("after 5 s: stored %d loaded %d, waiting for %d and %d",
				s.StoredBlocks, s.LoadedBlocks, stores, loads)
		}
	}
	return matching, recving, w.Clear()
}

func states(sched *kvtier.Connector, id string) (string, error) {
	_, history, err := sched.SlotState(id)
	names := make([]string, len(history))
	for i, s := range history {
		names[i] = s.String()
	}
	return strings.Join(names, " "), err
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Run runs the scenario from the scheduler's side (sched over manager m) and returns the
// transcript's lines.
func Run(m *kvtier.Manager, sched *kvtier.Connector, w Worker) (out []string, err error) {
	defer func() { // the calls below panic with their error (must), to keep the story plain
		if r := recover(); r != nil {
			if e, ok := r.(stepError); ok {
				out, err = nil, e.error
				return
			}
			panic(r)
		}
	}()
	salt := kvtier.HashSalt(nil)
	a := make([]uint32, 40)
	for i := range a {
		a[i] = uint32(1000 + i)
	}
	b := append([]uint32{}, a[:32]...)
	for t := uint32(2000); t < 2020; t++ {
		b = append(b, t)
	}
	ha := must(kvtier.HashSequence(a, Page, salt))
	hb := must(kvtier.HashSequence(b, Page, salt))
	say := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	stats := func() kvtier.ConnectorStats { return must(sched.Stats()) }

	n, async, err := sched.GetNumNewMatchedTokens("A", a, 0)
	check(err)
	say("A: matched %d async %d", n, b2i(async))
	check(sched.UpdateStateAfterAlloc("A", []uint32{1, 2, 3}, 0))
	_, _, err = EngineStep(sched, w, []kvtier.ScheduledRequest{{ReqID: "A", NumScheduledTokens: 40}},
		[]Write{{1, ha[0]}, {2, ha[1]}}, nil, 2, 0)
	check(err)
	say("A: stored %d loaded %d", stats().StoredBlocks, stats().LoadedBlocks)
	say("A: delay_free %d", b2i(must(sched.RequestFinished("A"))))
	say("A: states %s", must(states(sched, "A")))

	n, async, err = sched.GetNumNewMatchedTokens("B", b, 0)
	check(err)
	say("B: matched %d async %d", n, b2i(async))
	check(sched.UpdateStateAfterAlloc("B", []uint32{4, 5, 6, 7}, n))
	matching, recving, err := EngineStep(sched, w,
		[]kvtier.ScheduledRequest{{ReqID: "B", NumComputedTokens: 32, NumScheduledTokens: 20}},
		[]Write{{6, hb[2]}}, []Pair{{4, 1}, {5, 2}}, 3, 2)
	check(err)
	say("B: loaded blocks matching A's %d", matching)
	if len(recving) == 0 {
		recving = []string{"none"} // a synchronous load: the engine waited for it in its step
	}
	say("B: finished_recving %s", strings.Join(recving, " "))
	say("B: stored %d loaded %d", stats().StoredBlocks, stats().LoadedBlocks)
	_, _, err = EngineStep(sched, w, []kvtier.ScheduledRequest{
		{ReqID: "B", NumComputedTokens: 52, NumScheduledTokens: 1, NewTokenIDs: []uint32{3000}}}, nil, nil, 3, 2)
	check(err)
	say("B: delay_free %d", b2i(must(sched.RequestFinished("B"))))
	say("B: states %s", must(states(sched, "B")))

	g2 := must(m.MatchPrefix(hb, kvtier.G2))
	matching = 0
	if w.SharesManager() {
		for i, blk := range g2 {
			d := must(m.Data(blk))
			ok := true
			for k := range d {
				ok = ok && d[k] == KVByte(hb[i], k)
			}
			matching += b2i(ok)
		}
	} else {
		// G2's bytes are in the worker's process: load B's blocks into fresh G1 blocks as
		// request V, and compare them there with B's (blocks 4, 5, 6).
		v := append(append([]uint32{}, b[:48]...), 4000)
		n, _, err := sched.GetNumNewMatchedTokens("V", v, 0)
		check(err)
		check(sched.UpdateStateAfterAlloc("V", []uint32{8, 9, 10, 11}, n))
		matching, _, err = EngineStep(sched, w, []kvtier.ScheduledRequest{{ReqID: "V", NumComputedTokens: n, NumScheduledTokens: 1}},
			nil, []Pair{{8, 4}, {9, 5}, {10, 6}}, 3, 2+n/Page)
		check(err)
		must(sched.RequestFinished("V"))
	}
	check(m.Release(g2))
	say("G2: registered %d matching %d", len(g2), matching)
	return out, nil
}

type stepError struct{ error }

func check(err error) {
	if err != nil {
		panic(stepError{err})
	}
}

func must[T any](v T, err error) T {
	check(err)
	return v
}
