package server

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// TestTestRoutine runs sources through TestRoutine in the production
// runtime: declared tool results, tool argument schemas, budgets, and
// call_tool's one signature.
func TestTestRoutine(t *testing.T) {
	e := startEnv(t, nil, "", Options{RoutineLimits: routine.Limits{Pool: testPool(2)}})
	tools := []*dispatcherv1.TestRoutineTool{{
		Id:              "forecast",
		InputSchemaJson: `{"type":"object","required":["city"]}`,
		ResultJson:      `{"t":7}`,
	}}
	tests := []struct {
		name, src, fn string
		args          []string
		want, wantErr string
		wantBudget    bool
	}{
		{"call_tool", "def reply(q, m):\n    return call_tool('forecast', json.decode(q))\n", "reply", []string{`"{\"city\":\"Oslo\"}"`, `{}`}, `{"t":7}`, "", false},
		{"tool by id", "def send(task):\n    return forecast(task)['t'] + 1\n", "send", []string{`{"city":"Oslo"}`}, `8`, "", false},
		{"tool argument off schema", "def reply(q, m):\n    return call_tool('forecast', {})\n", "reply", []string{`"x"`, `{}`}, "", "argument of forecast", false},
		{"call_tool with one argument", "def reply(q, m):\n    return call_tool('forecast')\n", "reply", []string{`"x"`, `{}`}, "", "call_tool", false},
		{"missing function", "def send(task):\n    return 1\n", "parse", nil, "", "no function parse", false},
		{"512 MiB in one step", "def reply(q, m):\n    return 'x' * (1 << 29)\n", "reply", []string{`"x"`, `{}`}, "", "allocation budget", true},
		{"steps", "def reply(q, m):\n    while True:\n        pass\n", "reply", []string{`"x"`, `{}`}, "", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Contract: a budget ends every run (here the steps or the
			// allocation budget; the 1s wall-time budget, routine.Limits'
			// default, ends any other). The bound is a margin for a loaded
			// CI machine, not a speed; ctx's deadline is a backstop so that
			// a run no budget ends fails instead of hanging.
			const bound = 10 * time.Second
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			start := time.Now()
			resp, err := e.client.TestRoutine(ctx, &dispatcherv1.TestRoutineRequest{
				Source: tt.src, Tools: tools,
				Cases: []*dispatcherv1.TestRoutineCase{{Function: tt.fn, ArgsJson: tt.args}},
			})
			if err != nil {
				t.Fatal(err)
			}
			r := resp.GetResults()[0]
			if r.GetOutputJson() != tt.want || !strings.Contains(r.GetError(), tt.wantErr) || (tt.wantErr == "" && !tt.wantBudget) != (r.GetError() == "") || r.GetBudgetExceeded() != tt.wantBudget {
				t.Errorf("result = %v, want output %q, error containing %q, budget %v", r, tt.want, tt.wantErr, tt.wantBudget)
			}
			if d := time.Since(start); d > bound {
				t.Errorf("TestRoutine(%s) took %v; want a budget to end it (bound %v)", tt.name, d, bound)
			}
		})
	}
	// After the 512 MiB attempt, the server still answers.
	resp, err := e.client.TestRoutine(t.Context(), &dispatcherv1.TestRoutineRequest{
		Source: "def send(task):\n    return task\n",
		Cases:  []*dispatcherv1.TestRoutineCase{{Function: "send", ArgsJson: []string{`1`}}, {Function: "send", ArgsJson: []string{`[2]`}}},
	})
	if err != nil || len(resp.GetResults()) != 2 || resp.GetResults()[1].GetOutputJson() != "[2]" || strings.Join(resp.GetFunctions(), ",") != "send" {
		t.Fatalf("TestRoutine after the budget failures = %v, %v", resp, err)
	}
}

func TestTestRoutineErrors(t *testing.T) {
	e := startEnv(t, nil, "", Options{})
	cases := []*dispatcherv1.TestRoutineCase{{Function: "send"}}
	tests := []struct {
		name       string
		req        *dispatcherv1.TestRoutineRequest
		wantReason string
	}{
		{"no source", &dispatcherv1.TestRoutineRequest{Cases: cases}, "INVALID_ARGUMENT"},
		{"no cases", &dispatcherv1.TestRoutineRequest{Source: "x = 1"}, "INVALID_ARGUMENT"},
		{"args not JSON", &dispatcherv1.TestRoutineRequest{Source: "x = 1", Cases: []*dispatcherv1.TestRoutineCase{{Function: "send", ArgsJson: []string{"{"}}}}, "INVALID_ARGUMENT"},
		{"bad tool schema", &dispatcherv1.TestRoutineRequest{Source: "x = 1", Cases: cases, Tools: []*dispatcherv1.TestRoutineTool{{Id: "t", InputSchemaJson: `{"type":7}`}}}, "INVALID_ARGUMENT"},
		{"does not compile", &dispatcherv1.TestRoutineRequest{Source: "def send(:", Cases: cases}, "ROUTINE_INVALID"},
		{"top level fails", &dispatcherv1.TestRoutineRequest{Source: "x = 1 // 0", Cases: cases}, "ROUTINE_INVALID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.client.TestRoutine(t.Context(), tt.req)
			if status.Code(err) != codes.InvalidArgument || reasonOf(err) != tt.wantReason {
				t.Errorf("TestRoutine = %v (reason %q), want INVALID_ARGUMENT %s", err, reasonOf(err), tt.wantReason)
			}
		})
	}
}

// TestTestRoutine_takesTheCallersShare: an agent's dry runs take that
// agent's share of the routine workers, the one its envelopes take. An
// agent that floods its own routine with envelopes and POST
// /v1/routines:test with runaways at once still holds only its share, and
// another agent's envelopes, sent during the attack, are all answered by
// its routine (with dry runs in a share of their own, the attacker held
// every worker).
func TestTestRoutine_takesTheCallersShare(t *testing.T) {
	const attacker = "clients/acme/agents/attacker"
	const runaway = "def reply(q, m):\n    return all(range(1, 1 << 62))\n"
	// A 3 s budget for everyone (an agent's share of 4 workers is 3): a
	// killed run holds its worker 3.25 s, longer than the other agent waits
	// for one, and the other agent's calls fit on a machine the runaways
	// and -race keep busy (its worker replaced after a kill may take a
	// second to start there).
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{
		RoutineLimits:   routine.Limits{Pool: testPool(4), Timeout: 3 * time.Second},
		QuarantineAfter: 1000,
	})
	loopHex := e.reg.addProtocol("---\nname: Loop\ndescription: loops\nmultiround: false\n---\nAnything.")
	e.reg.addAgent(agentRes(attacker, registryv1.Dialect_DIALECT_UNSPECIFIED, registryv1.SupportPolicy_SUPPORT_POLICY_EXPLICIT, loopHex))
	e.setRoutine(attacker, loopHex, runaway)
	asAttacker := auth.WithPrincipal(t.Context(), auth.Principal{Kind: auth.Agent, Client: "clients/acme", Agent: attacker})

	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			e.do("POST", "/agora/acme/attacker", `{"protocolHash":"`+loopHex+`","body":"go"}`)
		})
		wg.Go(func() {
			for range 2 {
				_, _ = e.srv.TestRoutine(asAttacker, &dispatcherv1.TestRoutineRequest{
					Source: runaway,
					Cases:  []*dispatcherv1.TestRoutineCase{{Function: "reply", ArgsJson: []string{`1`, `{}`}}},
				})
			}
		})
	}
	attackDone := make(chan struct{})
	go func() { wg.Wait(); close(attackDone) }()
	calls := 0
	for attacking := true; attacking; calls++ {
		select {
		case <-attackDone:
			attacking = false
		default:
		}
		_, m, raw := e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+weatherHex+`","body":{"date":"2026-12-01","location":"Rome"}}`)
		if b, _ := m["body"].(map[string]any); m["status"] != "success" || b["weatherCondition"] != "sunny" {
			t.Errorf("the other agent's envelope %s during the attack = %s, want its routine's answer", strconv.Itoa(calls), raw)
			break
		}
	}
	<-attackDone
}
