package main

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// defaultStepsRoutine is the steps routine a fresh server gives the agent
// served at /ap/v1/agent: it echoes each step and says how to replace it.
const defaultStepsRoutine = `# The default agent's steps routine, installed by parley serve when it
# created the agent. It echoes each step. Replace it with your own:
#   parley routine set AGENT steps FILE   (a Starlark def step(...))
# or connect an SDK agent (its handler answers before any routine).
def step(task_input, step_input, additional_input):
    return {
        "output": "echo: " + step_input + " (default echo routine; replace it with: parley routine set AGENT steps FILE, or connect an SDK agent)",
        "is_last": False,
    }
`

// ensureDefaultAgent creates agent (clients/{client}/agents/{agent}) with
// an echo steps routine when the registry does not know it, so that a
// fresh server answers Agent Protocol steps at once. An agent that exists
// is left alone: whatever answers its steps was chosen by its owner.
func ensureDefaultAgent(ctx context.Context, conn grpc.ClientConnInterface, agent string, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	parts := strings.Split(agent, "/") // clients/{client}/agents/{agent}
	if len(parts) != 4 {
		return
	}
	reg := registryv1.NewRegistryServiceClient(conn)
	_, err := reg.GetAgent(ctx, &registryv1.GetAgentRequest{Name: agent}, grpc.WaitForReady(true))
	if status.Code(err) != codes.NotFound {
		if err != nil {
			logger.WarnContext(ctx, "could not check the default agent; create it yourself if steps wait", slog.String("agent", agent), slog.Any("err", err))
		}
		return
	}
	_, err = reg.CreateAgent(ctx, &registryv1.CreateAgentRequest{
		Parent:  "clients/" + parts[1],
		AgentId: parts[3],
		Agent:   &registryv1.Agent{DisplayName: "Default agent", Description: "Served at /ap/v1/agent. Echoes steps until you replace its steps routine or connect an SDK agent."},
	}, grpc.WaitForReady(true))
	if err != nil && status.Code(err) != codes.AlreadyExists {
		logger.WarnContext(ctx, "could not create the default agent", slog.String("agent", agent), slog.Any("err", err))
		return
	}
	_, err = dispatcherv1.NewDispatcherServiceClient(conn).SetRoutine(ctx, &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{
		Name:   agent + "/routines/steps",
		Source: strings.ReplaceAll(defaultStepsRoutine, "AGENT", parts[1]+":"+parts[3]),
	}}, grpc.WaitForReady(true))
	if err != nil {
		logger.WarnContext(ctx, "could not give the default agent its echo routine", slog.String("agent", agent), slog.Any("err", err))
		return
	}
	logger.InfoContext(ctx, "created the default agent with an echo steps routine; replace the routine or connect an SDK agent to answer steps",
		slog.String("agent", agent))
}
