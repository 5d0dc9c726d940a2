//go:build tools

// Package tools pins the containerd v2 commands a real e2e node runs; build.sh builds them from this
// module so their versions come from go.mod and go.sum, not from whatever is on the machine.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
