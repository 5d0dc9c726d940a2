package main

// What the kubelet stand-in records: one JSON line per registration, prepare and unprepare in
// the --results file, and the prepared devices on the pod (PreparedAnnotation).

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// PreparedAnnotation carries, on each pod the stand-in prepared, the devices the plugin returned,
// so tests can read the kubelet's view of a pod from the apiserver alone.
const PreparedAnnotation = "e2e.tessera.dev/prepared-devices"

type preparedDevice struct {
	RequestNames []string `json:"requestNames"`
	PoolName     string   `json:"poolName"`
	DeviceName   string   `json:"deviceName"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	ShareID      string   `json:"shareID,omitempty"`
}

type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	UID       string           `json:"uid"`
	Driver    string           `json:"driver"`
	Devices   []preparedDevice `json:"devices"`
}

// event is one line of the --results file.
type event struct {
	Time     string          `json:"time"`
	Event    string          `json:"event"`
	Node     string          `json:"node"`
	Pod      string          `json:"pod,omitempty"`
	PodUID   string          `json:"podUID,omitempty"`
	Driver   string          `json:"driver,omitempty"`
	Endpoint string          `json:"endpoint,omitempty"`
	Versions []string        `json:"versions,omitempty"`
	Service  string          `json:"service,omitempty"`
	Claims   []preparedClaim `json:"claims,omitempty"`
	Error    string          `json:"error,omitempty"`
	Deleted  int             `json:"deleted,omitempty"`
}

type recorder struct {
	mu   sync.Mutex
	f    *os.File
	node string
}

func (r *recorder) record(e event) {
	e.Time = time.Now().UTC().Format(time.RFC3339Nano)
	e.Node = r.node
	line, _ := json.Marshal(e)
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.f.Write(append(line, '\n'))
	fmt.Fprintf(os.Stderr, "kubelet: %s\n", line)
}

func claimsOf(req []*drav1.Claim, driver string) []preparedClaim {
	out := make([]preparedClaim, 0, len(req))
	for _, c := range req {
		out = append(out, preparedClaim{Namespace: c.Namespace, Name: c.Name, UID: c.Uid, Driver: driver})
	}
	return out
}

func ptrTo[T any](v T) *T { return &v }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
