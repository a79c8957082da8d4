package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
)

// connectAgent opens a Connect stream for agent and answers every request
// with answer until the test ends.
func connectAgent(t *testing.T, e *testEnv, hello *dispatcherv1.AgentHello, answer func(*dispatcherv1.ConnectResponse) *dispatcherv1.ConnectRequest) {
	t.Helper()
	stream, err := e.client.Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_Hello{Hello: hello}}); err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetReady() == nil {
		t.Fatalf("Connect: first message = %v, %v; want ready", first, err)
	}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if r := answer(m); r != nil {
				if stream.Send(r) != nil {
					return
				}
			}
		}
	}()
}

func TestConnectedHandler_answersProtocolNLAndSteps(t *testing.T) {
	reg := newFakeRegistry()
	reg.addProtocol(weatherPD)
	reg.addAgent(agentRes(weatherAgent, 0, 0, weatherHex))
	e := startEnv(t, reg, "", Options{})
	connectAgent(t, e, &dispatcherv1.AgentHello{Agent: weatherAgent, ProtocolHashes: []string{weatherB64}, NaturalLanguage: true, Steps: true},
		func(m *dispatcherv1.ConnectResponse) *dispatcherv1.ConnectRequest {
			switch k := m.GetKind().(type) {
			case *dispatcherv1.ConnectResponse_Envelope:
				body := `{"temperature":3,"precipitation":0,"weatherCondition":"cloudy"}`
				if k.Envelope.GetProtocolHash() == "" {
					body = `"It is cloudy."`
				}
				return &dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_EnvelopeReply{EnvelopeReply: &dispatcherv1.EnvelopeReply{
					RequestId: k.Envelope.GetRequestId(), BodyJson: []byte(body)}}}
			case *dispatcherv1.ConnectResponse_Step:
				return &dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_StepReply{StepReply: &dispatcherv1.StepReply{
					RequestId: k.Step.GetRequestId(), Output: "did " + k.Step.GetInput(), IsLast: true}}}
			}
			return nil
		})

	_, m, raw := e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+weatherHex+`","body":{"date":"d","location":"l"}}`)
	if b, _ := m["body"].(map[string]any); m["status"] != "success" || b["weatherCondition"] != "cloudy" {
		t.Errorf("POST weather to handler = %s, want the handler's answer", raw)
	}
	_, m, raw = e.do("POST", "/agora/acme/weather", `{"body":"How is the weather?"}`)
	if m["status"] != "success" || m["body"] != "It is cloudy." {
		t.Errorf("POST NL to handler = %s, want the handler's answer", raw)
	}
	resp, err := e.client.ExecuteStep(t.Context(), &dispatcherv1.ExecuteStepRequest{Agent: weatherAgent, TaskId: "t1", StepId: "s1", Input: "it"})
	if err != nil || resp.GetOutput() != "did it" || !resp.GetIsLast() || resp.GetExecutor() != "handler" {
		t.Errorf("ExecuteStep = %v, %v; want output \"did it\" from the handler", resp, err)
	}
}

func TestConnectedHandler_deadline(t *testing.T) {
	reg := newFakeRegistry()
	reg.addProtocol(weatherPD)
	reg.addAgent(agentRes(weatherAgent, 0, 0, weatherHex))
	e := startEnv(t, reg, "", Options{HandlerTimeout: 50 * time.Millisecond})
	connectAgent(t, e, &dispatcherv1.AgentHello{Agent: weatherAgent, ProtocolHashes: []string{weatherHex}},
		func(*dispatcherv1.ConnectResponse) *dispatcherv1.ConnectRequest { return nil }) // never answers
	_, m, raw := e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+weatherHex+`","body":{}}`)
	if m["status"] != "failure" || !strings.Contains(raw, "in time") {
		t.Errorf("POST to a silent handler = %s, want failure after the deadline", raw)
	}
}

func TestExecuteStep(t *testing.T) {
	reg := newFakeRegistry()
	reg.addAgent(agentRes(weatherAgent, 0, 0))
	e := startEnv(t, reg, "", Options{})

	_, err := e.client.ExecuteStep(t.Context(), &dispatcherv1.ExecuteStepRequest{Agent: weatherAgent, TaskId: "t", StepId: "s"})
	if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != "NO_EXECUTOR" {
		t.Errorf("ExecuteStep with no executor = %v, want FAILED_PRECONDITION NO_EXECUTOR", err)
	}
	_, err = e.client.ExecuteStep(t.Context(), &dispatcherv1.ExecuteStepRequest{Agent: "clients/acme/agents/ghost", TaskId: "t", StepId: "s"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("ExecuteStep for an unknown agent = %v, want NOT_FOUND", err)
	}
	_, err = e.client.ExecuteStep(t.Context(), &dispatcherv1.ExecuteStepRequest{Agent: weatherAgent})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("ExecuteStep without ids = %v, want INVALID_ARGUMENT", err)
	}

	e.setRoutine(weatherAgent, "steps", `
def step(task_input, step_input, additional_input):
    return {"output": task_input + ":" + step_input, "additional_output": {"k": additional_input.get("k")}, "is_last": step_input == "end"}
`)
	resp, err := e.client.ExecuteStep(t.Context(), &dispatcherv1.ExecuteStepRequest{Agent: weatherAgent, TaskId: "t", StepId: "s", TaskInput: "job", Input: "end", AdditionalInputJson: []byte(`{"k":7}`)})
	if err != nil || resp.GetOutput() != "job:end" || !resp.GetIsLast() || string(resp.GetAdditionalOutputJson()) != `{"k":7}` || resp.GetExecutor() != "routine" {
		t.Errorf("ExecuteStep with a step routine = %v, %v; want job:end, last, {\"k\":7}", resp, err)
	}

	// A routine that fails with no LLM to fall back on ends the step: the
	// agent has an executor, so the step must not be parked as if it had none.
	e.setRoutine(weatherAgent, "steps", "def step(t, i, a):\n    return 42\n")
	_, err = e.client.ExecuteStep(t.Context(), &dispatcherv1.ExecuteStepRequest{Agent: weatherAgent, TaskId: "t", StepId: "s"})
	if status.Code(err) != codes.Aborted || grpcerr.Reason(err) != "ROUTINE_FAILED" || strings.Contains(status.Convert(err).Message(), "42") {
		t.Errorf("ExecuteStep with a broken routine and no LLM = %v, want ABORTED ROUTINE_FAILED in one sentence without the routine's detail", err)
	}

	e.llm.reply = func(req LLMRequest) (LLMResult, error) {
		return LLMResult{Output: json.RawMessage(`"from the llm"`)}, nil
	}
	resp, err = e.client.ExecuteStep(t.Context(), &dispatcherv1.ExecuteStepRequest{Agent: weatherAgent, TaskId: "t", StepId: "s"})
	if err != nil || resp.GetOutput() != "from the llm" || resp.GetExecutor() != "llm" {
		t.Errorf("ExecuteStep with a broken routine = %v, %v; want the LLM's output", resp, err)
	}
}

func TestConnect_requiresHello(t *testing.T) {
	e := startEnv(t, nil, "", Options{})
	stream, err := e.client.Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_EnvelopeReply{EnvelopeReply: &dispatcherv1.EnvelopeReply{RequestId: "1"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Connect without hello: Recv = %v, want INVALID_ARGUMENT", err)
	}
}
