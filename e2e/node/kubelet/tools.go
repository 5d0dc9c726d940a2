//go:build tools

// Package tools pins the kubelet a real e2e node runs: k8s.io/kubernetes v1.36.3 with its staging
// modules at the matching published tags (the same replace block as the harness's go.mod).
package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
