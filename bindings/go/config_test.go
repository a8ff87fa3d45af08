package kvtier_test

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

const chunk, slots = 64, 4

// TestEngineOwnedG1RoundTripThroughG2: the engine's own KV memory (mmap, outside Go's heap)
// as G1, 2 layers x K/V with different strides. The engine writes a block's bytes into its
// memory, offloads it to G2, G1 evicts it, an onboard brings it back into another slot, and
// the engine reads the bytes from its memory there.
func TestEngineOwnedG1RoundTripThroughG2(t *testing.T) {
	strides := []uint64{chunk, 2 * chunk, 3 * chunk, chunk + 16}
	bufs := make([][]byte, 4)
	bases := make([]uintptr, 4)
	for i, s := range strides {
		b, err := syscall.Mmap(-1, 0, int((slots-1)*s+chunk), syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Munmap(b)
		bufs[i], bases[i] = b, uintptr(unsafe.Pointer(&b[0]))
	}
	cfg := testConfig()
	cfg.NumLayers, cfg.NumOuter, cfg.G1Blocks, cfg.G2Blocks = 2, 2, slots, 8
	cfg.G1Layout = &kvtier.G1Layout{Memory: kvtier.MemoryHost, Bases: bases, Strides: strides}
	m, err := kvtier.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	slotOf := func(b kvtier.Block) uint64 {
		slot := uint64(slots)
		for i := range bases {
			p, err := m.Chunk(b, uint32(i/2), uint32(i%2))
			if err != nil {
				t.Fatal(err)
			}
			off := uint64(p - bases[i])
			if off%strides[i] != 0 || off/strides[i] >= slots || (i > 0 && off/strides[i] != slot) {
				t.Fatalf("chunk %d of %x is not in the engine's slot: offset %d", i, b, off)
			}
			slot = off / strides[i]
		}
		return slot
	}
	chunkOf := func(i int, slot uint64) []byte { return bufs[i][slot*strides[i] : slot*strides[i]+chunk] }

	a, _ := m.Alloc(1, kvtier.G1)
	s := slotOf(a[0])
	want := make([][]byte, 4)
	for i := range bufs {
		for j := range chunkOf(i, s) {
			chunkOf(i, s)[j] = byte(17*i + j)
		}
		want[i] = append([]byte(nil), chunkOf(i, s)...)
	}
	a, err = m.RegisterHashes(a, []uint64{500}, 0)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := m.Offload(a, kvtier.G2, nil, 0)
	if n, err := x.Wait(-1); err != nil || n != 1 {
		t.Fatalf("offload: %d %v", n, err)
	}
	x.Close()
	m.Release(a)
	held, err := m.Alloc(slots, kvtier.G1) // evicts block 500 from G1
	if err != nil {
		t.Fatal(err)
	}
	if g1, _ := m.MatchPrefix([]uint64{500}, kvtier.G1); len(g1) != 0 {
		t.Fatal("block 500 is still in G1")
	}
	var keep, others []kvtier.Block
	for _, b := range held {
		if slotOf(b) == s {
			keep = append(keep, b) // slot s stays taken
		} else {
			others = append(others, b)
		}
	}
	m.Release(others)
	for i := range bufs {
		copy(chunkOf(i, s), make([]byte, chunk))
	}
	src, _ := m.MatchPrefix([]uint64{500}, kvtier.G2)
	dst, _ := m.Alloc(1, kvtier.G1)
	x, err = m.Onboard(src, dst, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := x.Wait(-1); err != nil || n != 1 {
		t.Fatalf("onboard: %d %v", n, err)
	}
	final, _ := x.Blocks()
	x.Close()
	u := slotOf(final[0])
	if u == s {
		t.Fatal("the onboard landed in the slot that was taken")
	}
	for i := range bufs {
		if string(chunkOf(i, u)) != string(want[i]) {
			t.Fatalf("chunk %d: the engine's memory does not hold the offloaded bytes", i)
		}
	}
	m.Release(append(append(src, final...), keep...))
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestBadG1LayoutsAreRefused(t *testing.T) {
	cfg := testConfig()
	cfg.G1Layout = &kvtier.G1Layout{Memory: kvtier.MemoryHost, Bases: []uintptr{4096}, Strides: nil}
	if _, err := kvtier.NewManager(cfg); !errors.Is(err, kvtier.ErrInvalidArgument) {
		t.Fatalf("bases without strides: %v", err)
	}
	cfg.G1Layout.Strides = []uint64{chunk} // 1 base, but 1 layer x 2 need 2
	_, err := kvtier.NewManager(cfg)
	var e *kvtier.Error
	if !errors.As(err, &e) || e.Status != kvtier.StatusInvalidArgument || e.Message == "" {
		t.Fatalf("one base for two chunks: %v", err)
	}
}

func TestAFrequencyPolicyOffloadsOnTheSecondOffer(t *testing.T) {
	cfg := testConfig()
	cfg.PolicyG1G2 = kvtier.Policy{Flags: kvtier.PolicyFrequency, MinFrequency: 2}
	cfg.MaxConcurrentTransfers, cfg.CopyThreads, cfg.CUDACopy = 2, 2, kvtier.CUDACopyPerChunk
	cfg.PolicyTimeoutUs, cfg.SweepIntervalUs, cfg.EventCapacity = 50000, 5000, 1024
	m, err := kvtier.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	a := stored(t, m, []uint64{600}, 1)
	for _, want := range []uint64{0, 1} { // filtered out once, then copied
		x, _ := m.Offload(a, kvtier.G2, nil, 0)
		if n, err := x.Wait(-1); err != nil || n != want {
			t.Fatalf("offload: %d %v, want %d", n, err, want)
		}
		x.Close()
	}
	m.Release(a)
}

func TestG3FaultFieldsFailOneWriteThenLetTheRestThrough(t *testing.T) {
	cfg := testConfig()
	cfg.G2Blocks, cfg.G3Blocks, cfg.G3Path, cfg.G3IO = 0, 8, t.TempDir(), kvtier.IOThreads
	cfg.G3FaultOp, cfg.G3FaultErrno, cfg.G3FaultSkip, cfg.G3FaultCount = kvtier.G3FaultWrite, int32(syscall.EIO), 0, 1
	// No presence filter: a failed offload's "on its way" mark may outlive its wait.
	cfg.PolicyG1G3 = kvtier.Policy{Flags: kvtier.PolicyPassAll, MinFrequency: 1}
	m, err := kvtier.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	a := stored(t, m, []uint64{700}, 1)
	x, _ := m.Offload(a, kvtier.G3, nil, 0)
	_, err = x.Wait(-1)
	var e *kvtier.Error
	if !errors.As(err, &e) || e.Status != kvtier.StatusIO || !strings.Contains(e.Message, "Input/output error") {
		t.Fatalf("injected EIO: %v", err)
	}
	x.Close()
	x, _ = m.Offload(a, kvtier.G3, nil, 0)
	if n, err := x.Wait(-1); err != nil || n != 1 {
		t.Fatalf("after the fault: %d %v", n, err)
	}
	x.Close()
	m.Release(a)
}

func TestDefaultConfigIsTheLibrarys(t *testing.T) {
	c := kvtier.DefaultConfig()
	if c.PageSize != 16 || c.G1Blocks != 1024 || c.MaxBatchSize != 64 || c.CopyThreads != 4 ||
		c.PolicyG1G2.Flags != kvtier.PolicyPresence || c.G1Memory != kvtier.MemoryHost ||
		c.G3FaultOp != kvtier.G3FaultOff {
		t.Fatalf("%+v", c)
	}
	var zero kvtier.Config // not a valid config: the library names the field
	_, err := kvtier.NewManager(zero)
	var e *kvtier.Error
	if !errors.As(err, &e) || e.Status != kvtier.StatusInvalidArgument || !strings.Contains(e.Message, "page_size") {
		t.Fatalf("zero config: %v", err)
	}
}
