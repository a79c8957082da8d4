package server

import (
	"encoding/json"
	"fmt"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/jsondepth"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
	"github.com/parleyhq/parley/services/negotiator/internal/routine"
)

// Maximum sizes of free inputs; bodies and PDs are also capped by the
// server's message size.
const (
	maxPeerLen     = 2048
	maxProtocolLen = 256 << 10
)

func checkAgent(v *grpcerr.Violations, name string, required bool) {
	const field = "agent"
	switch {
	case name == "" && required:
		v.Add(field, "is required")
	case name != "" && !resource.ValidAgentName(name):
		v.Add(field, "must look like clients/{client}/agents/{agent}, each id "+resource.IDRule)
	}
}

func checkPeer(v *grpcerr.Violations, peer string, required bool) {
	const field = "peer"
	switch {
	case peer == "" && required:
		v.Add(field, "is required")
	case len(peer) > maxPeerLen:
		v.Add(field, "is too long")
	}
}

func checkJSON(v *grpcerr.Violations, field string, raw []byte) {
	switch {
	case len(raw) == 0:
		v.Add(field, "is required")
	case jsondepth.Check(raw, jsondepth.Max) != nil:
		v.Add(field, tooDeep)
	case !json.Valid(raw):
		v.Add(field, "must be JSON")
	}
}

// tooDeep is the violation of JSON nested past jsondepth.Max.
var tooDeep = fmt.Sprintf("must be nested at most %d levels deep", jsondepth.Max)

func checkObjectJSON(v *grpcerr.Violations, field string, raw []byte) {
	if len(raw) == 0 {
		return
	}
	if jsondepth.Check(raw, jsondepth.Max) != nil {
		v.Add(field, tooDeep)
		return
	}
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		v.Add(field, "must be a JSON object")
	}
}

func checkProtocol(v *grpcerr.Violations, pd []byte, required bool) {
	const field = "protocol"
	switch {
	case len(pd) == 0 && required:
		v.Add(field, "is required")
	case len(pd) > maxProtocolLen:
		v.Add(field, "exceeds 256 KiB")
	}
}

func checkTask(v *grpcerr.Violations, t *negotiatorv1.TaskSpec, required bool) {
	const field = "task"
	if t == nil {
		if required {
			v.Add(field, "is required")
		}
		return
	}
	if t.GetName() == "" {
		v.Add(field+".name", "is required")
	}
	checkObjectJSON(v, field+".input_schema_json", t.GetInputSchemaJson())
	checkObjectJSON(v, field+".output_schema_json", t.GetOutputSchemaJson())
}

func checkTools(v *grpcerr.Violations, field string, tools []*negotiatorv1.ToolSpec) {
	for _, t := range tools {
		if t.GetName() == "" {
			v.Add(field+".name", "is required")
		}
		checkObjectJSON(v, field+".input_schema_json", t.GetInputSchemaJson())
		checkObjectJSON(v, field+".output_schema_json", t.GetOutputSchemaJson())
	}
}

func invalid(v grpcerr.Violations) error { return v.Err("INVALID_ARGUMENT", Domain) }

func taskOf(t *negotiatorv1.TaskSpec) *negotiation.Task {
	if t == nil {
		return nil
	}
	return &negotiation.Task{Name: t.GetName(), Description: t.GetDescription(), Input: t.GetInputSchemaJson(), Output: t.GetOutputSchemaJson()}
}

func taskProto(t *negotiation.Task) *negotiatorv1.TaskSpec {
	if t == nil {
		return nil
	}
	return &negotiatorv1.TaskSpec{Name: t.Name, Description: t.Description, InputSchemaJson: t.Input, OutputSchemaJson: t.Output}
}

func toolsOf(ts []*negotiatorv1.ToolSpec) []routine.Tool {
	out := make([]routine.Tool, 0, len(ts))
	for _, t := range ts {
		out = append(out, routine.Tool{Name: t.GetName(), Description: t.GetDescription(), Input: t.GetInputSchemaJson(), Output: t.GetOutputSchemaJson()})
	}
	return out
}
