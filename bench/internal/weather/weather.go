// Package weather is the benchmarks' routine-answered Agora agent: the
// weather PD, a table tool, and a Starlark routine that answers an envelope
// from the table, installed on a running `parley serve`.
package weather

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// PD is the weather protocol document; Hex is its hash.
const (
	PD  = "---\nname: Weather Forecast Query Protocol\ndescription: Query the weather forecast for a given date and location.\nmultiround: false\n---\n\nThe sender sends a JSON object {\"date\": \"YYYY-MM-DD\", \"location\": string}.\nThe receiver replies with a JSON object {\"temperature\": number (degrees C), \"precipitation\": number (mm), \"weatherCondition\": one of \"sunny\", \"cloudy\", \"rainy\", \"snowy\"}.\nIf the location is unknown the receiver replies {\"error\": \"Unsupported location\"}."
	Hex = "3a732bde0e63d2e838d1a722feebf3d67b52b211"
)

// Routine answers a query from the weather tool.
const Routine = `
def reply(query, memory):
    w = weather(query["location"] + "/" + query["date"])
    if w == None:
        return {"error": "Unsupported location"}
    return w
`

// Table is the weather tool's one entry.
const Table = `{"Paris/2026-12-01": {"temperature": 7, "precipitation": 1.5, "weatherCondition": "rainy"}}`

// Path is the agent's Agora route on the HTTP port; Envelope is a query
// the routine answers from the table.
const (
	Path     = "/agora/acme/weather"
	Envelope = `{"protocolHash":"` + Hex + `","protocolSources":null,"body":"{\"date\": \"2026-12-01\", \"location\": \"Paris\"}"}`
)

// Setup registers the PD and the agent clients/acme/agents/weather through
// the registry, and the tool and the routine through the dispatcher, over
// conn; ctx carries the operator's credentials.
func Setup(ctx context.Context, conn grpc.ClientConnInterface) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	reg := registryv1.NewRegistryServiceClient(conn)
	unimpl := func(call string, err error) error {
		if status.Code(err) == codes.Unimplemented {
			return fmt.Errorf("the registry does not implement %s yet (merge the registry first): %w", call, err)
		}
		return fmt.Errorf("%s: %w", call, err)
	}
	if _, err := reg.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(PD)}}); err != nil {
		return unimpl("CreateProtocol", err)
	}
	_, err := reg.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "weather", Agent: &registryv1.Agent{
		SupportPolicy: registryv1.SupportPolicy_SUPPORT_POLICY_IMPLEMENTED,
	}})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return unimpl("CreateAgent", err)
	}
	disp := dispatcherv1.NewDispatcherServiceClient(conn)
	const agent = "clients/acme/agents/weather"
	if _, err := disp.SetTool(ctx, &dispatcherv1.SetToolRequest{Tool: &dispatcherv1.Tool{
		Name: agent + "/tools/weather", Kind: &dispatcherv1.Tool_Table{Table: &dispatcherv1.TableTool{EntriesJson: Table}},
	}}); err != nil {
		return fmt.Errorf("SetTool: %w", err)
	}
	if _, err := disp.SetRoutine(ctx, &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{Name: agent + "/routines/" + Hex, Source: Routine}}); err != nil {
		return fmt.Errorf("SetRoutine: %w", err)
	}
	return nil
}
