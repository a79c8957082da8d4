package server

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/negotiation"
)

// fakeNegotiatorClient answers ReplyNaturalLanguage from a script of
// responses (or an error), recording the requests.
type fakeNegotiatorClient struct {
	negotiatorv1.NegotiatorServiceClient
	replies []*negotiatorv1.ReplyResponse
	err     error
	reqs    []*negotiatorv1.ReplyNaturalLanguageRequest
}

func (f *fakeNegotiatorClient) ReplyNaturalLanguage(_ context.Context, req *negotiatorv1.ReplyNaturalLanguageRequest, _ ...grpc.CallOption) (*negotiatorv1.ReplyResponse, error) {
	f.reqs = append(f.reqs, req)
	if f.err != nil {
		return nil, f.err
	}
	r := f.replies[0]
	if len(f.replies) > 1 {
		f.replies = f.replies[1:]
	}
	return r, nil
}

func TestNegotiatorLLM(t *testing.T) {
	toolCall := &negotiatorv1.ReplyResponse{ToolCall: &negotiatorv1.ToolCall{Name: "forecast", ArgumentsJson: []byte(`{"city":"Paris"}`)}}
	tests := []struct {
		name      string
		client    *fakeNegotiatorClient
		want      string
		wantErr   error
		wantTools int // tool calls run by the dispatcher
	}{
		{"body", &fakeNegotiatorClient{replies: []*negotiatorv1.ReplyResponse{{Body: []byte(`"sunny"`)}}}, `"sunny"`, nil, 0},
		{"tool call then body", &fakeNegotiatorClient{replies: []*negotiatorv1.ReplyResponse{toolCall, {Body: []byte(`"18 degrees"`)}}}, `"18 degrees"`, nil, 1},
		{"endless tool calls are bounded", &fakeNegotiatorClient{replies: []*negotiatorv1.ReplyResponse{toolCall}}, "", nil, maxToolRounds},
		{"not configured", &fakeNegotiatorClient{err: grpcerr.New(codes.FailedPrecondition, "no LLM", "LLM_NOT_CONFIGURED", "negotiator.parley.dev", nil)}, "", ErrNoLLM, 0},
		{"budget", &fakeNegotiatorClient{err: grpcerr.New(codes.ResourceExhausted, "spent 3 of 2", "LLM_BUDGET_EXHAUSTED", "negotiator.parley.dev", nil)}, "", ErrLLMBudget, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ran := 0
			req := LLMRequest{Agent: "clients/a/agents/b", Purpose: PurposeReply, Input: json.RawMessage(`"weather?"`),
				Tools: []LLMTool{{Name: "forecast"}},
				CallTool: func(_ context.Context, name string, arg json.RawMessage) (json.RawMessage, error) {
					ran++
					if name != "forecast" || string(arg) != `{"city":"Paris"}` {
						return nil, errors.New("unexpected call")
					}
					return json.RawMessage(`{"t":18}`), nil
				}}
			res, err := NegotiatorLLM{C: tt.client}.Complete(t.Context(), req)
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			case tt.want == "":
				if err == nil || !strings.Contains(err.Error(), "tool calls") {
					t.Fatalf("err = %v, want too many tool calls", err)
				}
			case err != nil || string(res.Output) != tt.want:
				t.Fatalf("Complete = %s, %v; want %s", res.Output, err, tt.want)
			}
			if ran != tt.wantTools {
				t.Errorf("tool ran %d times, want %d", ran, tt.wantTools)
			}
			for i, r := range tt.client.reqs {
				if r.GetPeer() == "" || len(r.GetToolResults()) != i || len(r.GetTools()) != 1 {
					t.Errorf("request %d = %v: want a peer, %d tool results and the tool", i, r, i)
				}
			}
		})
	}
	if msg := llm.Failure(llmError(grpcerr.New(codes.ResourceExhausted, "spent", "LLM_BUDGET_EXHAUSTED", "d", nil))); !strings.Contains(msg, "budget is exhausted") || !strings.Contains(msg, "routine") {
		t.Errorf("budget failure text %q is not clear", msg)
	}
}

// An unreachable negotiator is one sentence for the Agora peer: the
// transport's text (our addresses, ports, resolver) is not for strangers.
func TestLLMError_unreachableNegotiatorNamesNothingOfOurs(t *testing.T) {
	transport := status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 10.1.2.3:9090: connect: connection refused"`)
	msg := llm.Failure(llmError(transport))
	if strings.Contains(msg, "10.1.2.3") || strings.Contains(msg, "transport") || !strings.Contains(msg, "unavailable") {
		t.Errorf("llm.Failure(llmError(%v)) = %q, want a sentence saying the negotiator is unavailable and nothing of the transport", transport, msg)
	}
}

// The same holds on the negotiation path (negotiation.Failure).
func TestLLMError_unreachableNegotiatorOnTheNegotiationPath(t *testing.T) {
	transport := status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 10.1.2.3:9090: connect: connection refused"`)
	msg := negotiation.Failure(llmError(transport))
	if strings.Contains(msg, "10.1.2.3") || strings.Contains(msg, "transport") || !strings.Contains(msg, "unavailable") {
		t.Errorf("negotiation.Failure(llmError(%v)) = %q, want a sentence saying the negotiator is unavailable and nothing of the transport", transport, msg)
	}
}
