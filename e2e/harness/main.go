// Command tessera-harness is a multi-call binary holding the pieces of a real Kubernetes control
// plane (and a kubelet stand-in plus oracles) that tessera's end-to-end tests drive. Each role runs
// as its own process because the upstream commands install process-wide signal handlers, feature
// gates and metrics registries that cannot be shared.
package main

import (
	"fmt"
	"os"
	"sort"
)

type role struct {
	summary string
	run     func(args []string) int
}

var roles = map[string]role{
	"etcd":               {"embedded etcd server on 127.0.0.1", runEtcd},
	"apiserver":          {"kube-apiserver (upstream command and flags)", runAPIServer},
	"scheduler":          {"kube-scheduler (upstream command and flags)", runScheduler},
	"controller-manager": {"kube-controller-manager (upstream command and flags)", runControllerManager},
	"kubectl":            {"kubectl built from k8s.io/kubectl", runKubectl},
	"kubelet":            {"kubelet stand-in for one fake node: plugin registration, prepare/unprepare", runKubelet},
	"cdi":                {"validate CDI spec dirs and inject devices into an OCI spec (CDI reference library)", runCDI},
	"cel":                {"evaluate DRA CEL selectors on devices (the scheduler's CEL library): an oracle", runCEL},
	"allocate":           {"run the scheduler's structured allocator on slices/classes/claims: an oracle", runAllocate},
	"forward":            {"TCP forwarder from an inherited listening socket to an address in the caller's network", runForward},
}

func usage() {
	names := make([]string, 0, len(roles))
	for name := range roles {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintln(os.Stderr, "usage: tessera-harness ROLE [flags...]\n\nroles:")
	for _, name := range names {
		fmt.Fprintf(os.Stderr, "  %-20s %s\n", name, roles[name].summary)
	}
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" {
		usage()
		os.Exit(2)
	}
	r, ok := roles[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown role %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	os.Exit(r.run(os.Args[2:]))
}
