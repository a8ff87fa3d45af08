// Seed 003's two requests through the tiers: the scenario of examples/scenario/scenario.c,
// line for line the same output.
package main

import (
	"fmt"
	"os"

	kvtier "github.com/kvtier/kvtier/bindings/go"
)

const page = 4

func tokenize(s string) []uint32 {
	out := make([]uint32, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = uint32(s[i])
	}
	return out
}

func kvByte(h uint64, i int) byte { return byte((h >> (8 * (i % 8))) ^ uint64(i)) }

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	cfg := kvtier.DefaultConfig()
	cfg.PageSize, cfg.NumLayers, cfg.NumOuter, cfg.ChunkBytes = page, 1, 2, 64
	cfg.G1Blocks, cfg.G2Blocks, cfg.G3Blocks = 8, 16, 0
	m, err := kvtier.NewManager(cfg)
	must(err)
	defer m.Close()
	salt := kvtier.HashSalt([]byte("kvtier-scenario"))

	aTokens := tokenize("Hello, world!")
	aHash, err := kvtier.HashSequence(aTokens, page, salt)
	must(err)
	a, err := m.Alloc(len(aHash), kvtier.G1)
	must(err)
	for i, b := range a {
		d, err := m.Data(b)
		must(err)
		for j := range d {
			d[j] = kvByte(aHash[i], j)
		}
	}
	a, err = m.RegisterHashes(a, aHash, 0)
	must(err)
	x, err := m.Offload(a, kvtier.G2, nil, 1)
	must(err)
	moved, err := x.Wait(-1)
	must(err)
	x.Close()
	must(m.Release(a))
	fmt.Printf("request A: %d tokens, %d full blocks, computed %d, offloaded %d to G2\n",
		len(aTokens), len(aHash), len(aHash), moved)
	fmt.Printf("request A: first block hash 0x%016x\n", aHash[0])

	for ev, _ := m.Poll(64); len(ev) > 0; ev, _ = m.Poll(64) {
	}
	all, err := m.Alloc(8, kvtier.G1)
	must(err)
	must(m.Release(all))
	removed := 0
	for ev, _ := m.Poll(64); len(ev) > 0; ev, _ = m.Poll(64) {
		for _, e := range ev {
			if e.Type == kvtier.EventBlockRemoved && e.Tier == kvtier.G1 {
				removed++
			}
		}
	}
	fmt.Printf("G1 evicted: %d blocks removed\n", removed)

	bTokens := tokenize("Hello, world! How are you?")
	bHash, err := kvtier.HashSequence(bTokens, page, salt)
	must(err)
	g1, err := m.MatchPrefix(bHash, kvtier.G1)
	must(err)
	g2, err := m.MatchPrefix(bHash[len(g1):], kvtier.G2)
	must(err)
	dst, err := m.Alloc(len(g2), kvtier.G1)
	must(err)
	x, err = m.Onboard(g2, dst, nil, 2)
	must(err)
	moved, err = x.Wait(-1)
	must(err)
	final, err := x.Blocks()
	must(err)
	x.Close()
	g1Hit := len(g1)
	g1 = append(g1, final...)
	same := true
	for i, b := range g1 {
		d, err := m.Data(b)
		must(err)
		for j := range d {
			same = same && d[j] == kvByte(aHash[i], j)
		}
	}
	must(m.Release(g2))
	must(m.Release(g1))
	fmt.Printf("request B: %d tokens, %d full blocks, G1 hit %d, G2 hit %d, onboarded %d\n",
		len(bTokens), len(bHash), g1Hit, len(g2), moved)
	answer := "no"
	if same {
		answer = "yes"
	}
	fmt.Printf("request B: onboarded bytes equal request A's: %s\n", answer)
	must(m.Check())
	if !same {
		os.Exit(1)
	}
}
