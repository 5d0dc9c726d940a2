package main

import (
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// olderClusterGates switches off the DRA features that a 1.34/1.35-era cluster would not have on,
// so tests can check that tessera's slices and claims still work there.
const olderClusterGates = "DRAConsumableCapacity=false,DRAPartitionableDevices=false"

// withOlderCluster strips the harness-only --older-cluster flag and, when present, appends the
// feature gates it stands for (merged into an explicit --feature-gates flag if one was given).
func withOlderCluster(args []string) []string {
	older := false
	out := make([]string, 0, len(args)+1)
	gatesAt := -1
	for _, a := range args {
		switch {
		case a == "--older-cluster":
			older = true
			continue
		case len(a) > len("--feature-gates=") && a[:len("--feature-gates=")] == "--feature-gates=":
			gatesAt = len(out)
		}
		out = append(out, a)
	}
	if !older {
		return out
	}
	if gatesAt >= 0 {
		out[gatesAt] = out[gatesAt] + "," + olderClusterGates
		return out
	}
	return append(out, "--feature-gates="+olderClusterGates)
}

func runCobra(cmd *cobra.Command, args []string) int {
	cmd.SetArgs(args)
	return cli.Run(cmd)
}

func runAPIServer(args []string) int {
	return runCobra(apiserverapp.NewAPIServerCommand(), withOlderCluster(args))
}

func runScheduler(args []string) int {
	return runCobra(schedulerapp.NewSchedulerCommand(), withOlderCluster(args))
}

func runControllerManager(args []string) int {
	return runCobra(kcmapp.NewControllerManagerCommand(), withOlderCluster(args))
}

func runKubectl(args []string) int {
	cmd := kubectlcmd.NewDefaultKubectlCommand()
	cmd.SetArgs(args)
	// kubectl's root command expects os.Args[0] to look like "kubectl" for plugin lookup only.
	os.Args = append([]string{"kubectl"}, args...)
	return cli.Run(cmd)
}
