package main

// The `cdi` role checks tessera's CDI specs with the CDI reference library, the code container
// runtimes (containerd, CRI-O, podman) use to resolve the device ids kubelet passes them.

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type stringList []string

func (s *stringList) String() string     { return fmt.Sprint(*s) }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

type cdiSpecReport struct {
	Path    string   `json:"path"`
	Kind    string   `json:"kind"`
	Version string   `json:"version"`
	Devices []string `json:"devices"`
}

type cdiReport struct {
	Specs      []cdiSpecReport     `json:"specs"`
	Devices    []string            `json:"devices"`
	Errors     map[string][]string `json:"errors"`
	Unresolved []string            `json:"unresolved,omitempty"`
	OCISpec    *oci.Spec           `json:"ociSpec,omitempty"`
}

func runCDI(args []string) int {
	if len(args) == 0 || (args[0] != "validate" && args[0] != "inject") {
		fmt.Fprintln(os.Stderr, "usage: tessera-harness cdi validate --spec-dir DIR...\n"+
			"       tessera-harness cdi inject --spec-dir DIR... [--oci-spec FILE] DEVICE...")
		return 2
	}
	fs := flag.NewFlagSet("cdi "+args[0], flag.ContinueOnError)
	var dirs stringList
	fs.Var(&dirs, "spec-dir", "CDI spec directory (repeatable; later ones take priority)")
	ociPath := fs.String("oci-spec", "", "OCI runtime spec to inject into (default: a minimal one)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if len(dirs) == 0 {
		fmt.Fprintln(os.Stderr, "cdi: at least one --spec-dir is required")
		return 2
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		// NewCache reports spec errors here too; they are listed in the report below.
		fmt.Fprintf(os.Stderr, "cdi: %v\n", err)
	}
	rep := cdiReport{Specs: []cdiSpecReport{}, Devices: nonNil(cache.ListDevices()), Errors: map[string][]string{}}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			rep.Errors[path] = append(rep.Errors[path], e.Error())
		}
	}
	for dir, e := range cache.GetSpecDirErrors() {
		if e != nil {
			rep.Errors[dir] = append(rep.Errors[dir], e.Error())
		}
	}
	for _, vendor := range cache.ListVendors() {
		for _, spec := range cache.GetVendorSpecs(vendor) {
			sr := cdiSpecReport{Path: spec.GetPath(), Kind: spec.Kind, Version: spec.Version, Devices: []string{}}
			for _, d := range spec.Devices {
				sr.Devices = append(sr.Devices, d.Name)
			}
			rep.Specs = append(rep.Specs, sr)
		}
	}
	sort.Slice(rep.Specs, func(i, j int) bool { return rep.Specs[i].Path < rep.Specs[j].Path })
	rc := 0
	if len(rep.Errors) > 0 {
		rc = 1
	}
	if args[0] == "inject" {
		spec := &oci.Spec{Version: oci.Version, Process: &oci.Process{Args: []string{"/bin/true"}, Cwd: "/"}, Root: &oci.Root{Path: "rootfs"}, Linux: &oci.Linux{}}
		if *ociPath != "" {
			data, err := os.ReadFile(*ociPath)
			if err != nil {
				fmt.Fprintf(os.Stderr, "cdi: --oci-spec: %v\n", err)
				return 2
			}
			spec = &oci.Spec{}
			if err := json.Unmarshal(data, spec); err != nil {
				fmt.Fprintf(os.Stderr, "cdi: --oci-spec %s: %v\n", *ociPath, err)
				return 2
			}
		}
		if fs.NArg() == 0 {
			fmt.Fprintln(os.Stderr, "cdi inject: no devices given")
			return 2
		}
		unresolved, err := cache.InjectDevices(spec, fs.Args()...)
		rep.Unresolved = unresolved
		if err != nil {
			rep.Errors["inject"] = append(rep.Errors["inject"], err.Error())
			rc = 1
		} else {
			rep.OCISpec = spec
		}
	}
	out, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Println(string(out))
	return rc
}
