package main

// The `cel` role is the oracle for tessera's CEL engine: it evaluates DeviceClass/claim selectors
// with k8s.io/dynamic-resource-allocation/cel, the code the scheduler runs.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apiserver/pkg/cel/environment"
	dracel "k8s.io/dynamic-resource-allocation/cel"
)

// celCase is one corpus entry. The device is either in corpus form (attributes and capacity
// nested by domain) or in ResourceSlice form (qualified names as keys); both are accepted.
type celCase struct {
	Name       string          `json:"name"`
	Expression string          `json:"expression"`
	Device     json.RawMessage `json:"device"`
	// Env, when set, compiles this case the way the apiserver validates a selector: in the named
	// environment ("new" for a created or changed selector, "stored" for an unchanged one) with these
	// feature gates, estimating the cost; the evaluation uses that compilation. Without it the case is
	// compiled as the scheduler does (the cache, StoredExpressions, the role's flags).
	Env *celEnv `json:"env,omitempty"`
}

type celEnv struct {
	Type               string `json:"type"`
	ConsumableCapacity bool   `json:"consumableCapacity"`
	ListTypeAttributes bool   `json:"listTypeAttributes"`
}

// compileIn compiles like the apiserver's validation: GetCompiler with the gates, then
// CompileCELExpression in the named environment with cost estimation on.
func compileIn(env celEnv, expression string) (dracel.CompilationResult, error) {
	var envType environment.Type
	switch env.Type {
	case "new":
		envType = environment.NewExpressions
	case "stored":
		envType = environment.StoredExpressions
	default:
		return dracel.CompilationResult{}, fmt.Errorf("env.type must be \"new\" or \"stored\", not %q", env.Type)
	}
	features := dracel.Features{EnableConsumableCapacity: env.ConsumableCapacity, EnableListTypeAttributes: env.ListTypeAttributes}
	return dracel.GetCompiler(features).CompileCELExpression(expression, dracel.Options{EnvType: &envType}), nil
}

type celResult struct {
	Name    string `json:"name"`
	Result  *bool  `json:"result,omitempty"`
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
	// EstimatedCost is cel-go's worst-case estimate (CompilationResult.MaxCost), the number the
	// apiserver compares with resourceapi.CELSelectorExpressionMaxCost; ActualCost is what the
	// evaluation of this device really cost (the scheduler's runtime limit applies to it).
	EstimatedCost *uint64 `json:"estimatedCost,omitempty"`
	ActualCost    *uint64 `json:"actualCost,omitempty"`
}

type corpusDevice struct {
	Driver                   string                     `json:"driver"`
	Attributes               map[string]json.RawMessage `json:"attributes"`
	Capacity                 map[string]json.RawMessage `json:"capacity"`
	AllowMultipleAllocations *bool                      `json:"allowMultipleAllocations"`
}

// isAttributeValue tells a ResourceSlice attribute ({"int": 1}) from a corpus domain map
// ({"name": {"int": 1}}).
func isAttributeValue(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || len(m) != 1 {
		return false
	}
	for k := range m {
		switch k {
		case "int", "bool", "string", "version":
			return true
		}
	}
	return false
}

func qualify(domain, name string) resourceapi.QualifiedName {
	if domain == "" {
		return resourceapi.QualifiedName(name)
	}
	return resourceapi.QualifiedName(domain + "/" + name)
}

func decodeCELDevice(raw json.RawMessage) (dracel.Device, error) {
	var cd corpusDevice
	if err := json.Unmarshal(raw, &cd); err != nil {
		return dracel.Device{}, err
	}
	dev := dracel.Device{Driver: cd.Driver, AllowMultipleAllocations: cd.AllowMultipleAllocations,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{},
		Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}}
	for key, v := range cd.Attributes {
		if isAttributeValue(v) {
			var a resourceapi.DeviceAttribute
			if err := json.Unmarshal(v, &a); err != nil {
				return dev, fmt.Errorf("attribute %s: %w", key, err)
			}
			dev.Attributes[resourceapi.QualifiedName(key)] = a
			continue
		}
		var inner map[string]resourceapi.DeviceAttribute
		if err := json.Unmarshal(v, &inner); err != nil {
			return dev, fmt.Errorf("attributes of domain %s: %w", key, err)
		}
		for name, a := range inner {
			dev.Attributes[qualify(key, name)] = a
		}
	}
	for key, v := range cd.Capacity {
		var asCapacity resourceapi.DeviceCapacity
		if json.Unmarshal(v, &asCapacity) == nil && !asCapacity.Value.IsZero() {
			dev.Capacity[resourceapi.QualifiedName(key)] = asCapacity
			continue
		}
		var inner map[string]string
		if err := json.Unmarshal(v, &inner); err != nil {
			return dev, fmt.Errorf("capacity %s: want a quantity map per domain or {\"value\": q}: %w", key, err)
		}
		for name, q := range inner {
			parsed, err := resource.ParseQuantity(q)
			if err != nil {
				return dev, fmt.Errorf("capacity %s/%s: %w", key, name, err)
			}
			dev.Capacity[qualify(key, name)] = resourceapi.DeviceCapacity{Value: parsed}
		}
	}
	return dev, nil
}

func runCEL(args []string) int {
	fs := flag.NewFlagSet("cel", flag.ContinueOnError)
	input := fs.String("corpus", "-", "JSON corpus file (a list of cases, or {\"cases\": [...]}); - for stdin")
	consumable := fs.Bool("consumable-capacity", true, "compile with the DRAConsumableCapacity environment (device.allowMultipleAllocations)")
	listTypes := fs.Bool("list-type-attributes", false, "compile with the DRAListTypeAttributes environment (alpha in 1.36, off like the scheduler by default)")
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
		fmt.Fprintf(os.Stderr, "cel: %v\n", err)
		return 2
	}
	var cases []celCase
	if err := json.Unmarshal(data, &cases); err != nil {
		var wrapped struct {
			Cases []celCase `json:"cases"`
		}
		if err2 := json.Unmarshal(data, &wrapped); err2 != nil {
			fmt.Fprintf(os.Stderr, "cel: corpus is neither a list of cases nor {\"cases\": [...]}: %v\n", err)
			return 2
		}
		cases = wrapped.Cases
	}
	features := dracel.Features{EnableConsumableCapacity: *consumable, EnableListTypeAttributes: *listTypes}
	cache := dracel.NewCache(len(cases)+1, features)
	newExpressions := environment.NewExpressions
	results := make([]celResult, 0, len(cases))
	for _, c := range cases {
		r := celResult{Name: c.Name}
		var compiled, estimate dracel.CompilationResult
		if c.Env != nil {
			compiled, err = compileIn(*c.Env, c.Expression)
			if err != nil {
				fmt.Fprintf(os.Stderr, "cel: case %q: %v\n", c.Name, err)
				return 2
			}
			estimate = compiled
		} else {
			compiled = cache.GetOrCompile(c.Expression)
			// The scheduler's cache compiles without estimating; the apiserver's validation estimates
			// with the environment for new expressions, as here.
			estimate = dracel.GetCompiler(features).CompileCELExpression(c.Expression, dracel.Options{EnvType: &newExpressions})
		}
		if estimate.Error == nil && estimate.MaxCost != math.MaxUint64 {
			estimated := estimate.MaxCost
			r.EstimatedCost = &estimated
		}
		if compiled.Error != nil {
			r.Error, r.Message = "compile", compiled.Error.Error()
			results = append(results, r)
			continue
		}
		dev, err := decodeCELDevice(c.Device)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cel: case %q: device: %v\n", c.Name, err)
			return 2
		}
		ok, details, err := compiled.DeviceMatches(context.Background(), dev)
		if details != nil && details.ActualCost() != nil {
			actual := *details.ActualCost()
			r.ActualCost = &actual
		}
		if err != nil {
			r.Error, r.Message = "runtime", err.Error()
		} else {
			r.Result = &ok
		}
		results = append(results, r)
	}
	out, _ := json.MarshalIndent(results, "", "  ")
	fmt.Println(string(out))
	return 0
}
