// Seed 003 through the connector, in one process: prints the transcript of the C example
// examples/connector_seed003, line for line.
package main

import (
	"fmt"
	"os"

	kvtier "github.com/kvtier/kvtier/bindings/go"
	"github.com/kvtier/kvtier/bindings/go/internal/seed003"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	g1, err := seed003.NewG1()
	if err != nil {
		return err
	}
	defer g1.Close() // after the manager's Close
	m, err := kvtier.NewManager(seed003.ManagerConfig())
	if err != nil {
		return err
	}
	defer m.Close()
	c, err := m.NewConnector(seed003.ConnectorConfig(kvtier.RoleBoth))
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.RegisterKVCaches(g1.Layout(), seed003.GPUBlocks); err != nil {
		return err
	}
	lines, err := seed003.Run(m, c, seed003.LocalWorker{C: c, G1: g1})
	for _, l := range lines {
		fmt.Println(l)
	}
	return err
}
