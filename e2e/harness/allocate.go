package main

// The `allocate` role runs the scheduler's structured allocator (the code inside the
// DynamicResources plugin) on given slices, classes and claims: an oracle for what the real
// scheduler may decide, without a cluster.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type allocateInput struct {
	Node            v1.Node                      `json:"node"`
	Slices          []*resourceapi.ResourceSlice `json:"slices"`
	Classes         []*resourceapi.DeviceClass   `json:"classes"`
	Claims          []*resourceapi.ResourceClaim `json:"claims"`
	AllocatedClaims []*resourceapi.ResourceClaim `json:"allocatedClaims"`
	Features        *structured.Features         `json:"features"`
}

type allocateOutput struct {
	Allocations []resourceapi.AllocationResult `json:"allocations"`
	Error       string                         `json:"error,omitempty"`
}

type classList []*resourceapi.DeviceClass

func (l classList) List() ([]*resourceapi.DeviceClass, error) { return l, nil }
func (l classList) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("DeviceClass %q not found", name)
}

// allocatedState books what already-allocated claims hold, as the scheduler does from its
// claim cache: whole devices as taken, shares by id plus their consumed capacity.
func allocatedState(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	st := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				st.AllocatedDevices.Insert(id)
				continue
			}
			st.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			consumed := map[resourceapi.QualifiedName]resource.Quantity{}
			for k, q := range r.ConsumedCapacity {
				consumed[k] = q
			}
			st.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, consumed))
		}
	}
	return st
}

func runAllocate(args []string) int {
	fs := flag.NewFlagSet("allocate", flag.ContinueOnError)
	input := fs.String("input", "-", "JSON {node, slices, classes, claims, allocatedClaims, features}; - for stdin")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var data []byte
	var err error
	if *input == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(*input)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "allocate: %v\n", err)
		return 2
	}
	var in allocateInput
	if err := json.Unmarshal(data, &in); err != nil {
		fmt.Fprintf(os.Stderr, "allocate: input: %v\n", err)
		return 2
	}
	features := structured.Features{ConsumableCapacity: true, PartitionableDevices: true, PrioritizedList: true, DeviceTaints: true}
	if in.Features != nil {
		features = *in.Features
	}
	ctx := context.Background()
	cache := dracel.NewCache(100, dracel.Features{EnableConsumableCapacity: features.ConsumableCapacity})
	alloc, err := structured.NewAllocator(ctx, features, allocatedState(in.AllocatedClaims), classList(in.Classes), in.Slices, cache)
	out := allocateOutput{}
	if err == nil {
		out.Allocations, err = alloc.Allocate(ctx, &in.Node, in.Claims)
	}
	if err != nil {
		out.Error = err.Error()
	}
	enc, _ := json.MarshalIndent(out, "", "  ")
	fmt.Println(string(enc))
	if out.Error != "" {
		return 1
	}
	return 0
}
