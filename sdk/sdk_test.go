package sdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/sdk"
)

// fakeDispatcher answers the hello, then sends the scripted requests and
// hands every reply to replies.
type fakeDispatcher struct {
	dispatcherv1.UnimplementedDispatcherServiceServer
	requests []*dispatcherv1.ConnectResponse
	hello    chan *dispatcherv1.AgentHello
	replies  chan *dispatcherv1.ConnectRequest
}

func (f *fakeDispatcher) Connect(stream dispatcherv1.DispatcherService_ConnectServer) error {
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	f.hello <- m.GetHello()
	if err := stream.Send(&dispatcherv1.ConnectResponse{Kind: &dispatcherv1.ConnectResponse_Ready{Ready: &dispatcherv1.ConnectReady{Agent: m.GetHello().GetAgent()}}}); err != nil {
		return err
	}
	for _, r := range f.requests {
		if err := stream.Send(r); err != nil {
			return err
		}
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return nil
		}
		f.replies <- m
	}
}

// recvTimeout bounds every wait on a channel, so that a lost message fails
// the test instead of hanging it until go test's own limit.
const recvTimeout = 30 * time.Second

// recv returns the next value from ch, failing the test after recvTimeout.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(recvTimeout):
		t.Fatalf("no %s within %s", what, recvTimeout)
		var zero T
		return zero
	}
}

func TestConnect_answersEnvelopesAndSteps(t *testing.T) {
	const hash = "3a732bde0e63d2e838d1a722feebf3d67b52b211"
	f := &fakeDispatcher{
		hello:   make(chan *dispatcherv1.AgentHello, 1),
		replies: make(chan *dispatcherv1.ConnectRequest, 4),
		requests: []*dispatcherv1.ConnectResponse{
			{Kind: &dispatcherv1.ConnectResponse_Envelope{Envelope: &dispatcherv1.EnvelopeRequest{RequestId: "1", ProtocolHash: hash, BodyJson: []byte(`{"location":"Paris"}`)}}},
			{Kind: &dispatcherv1.ConnectResponse_Envelope{Envelope: &dispatcherv1.EnvelopeRequest{RequestId: "2", BodyJson: []byte(`"hi"`)}}},
			{Kind: &dispatcherv1.ConnectResponse_Step{Step: &dispatcherv1.StepRequest{RequestId: "3", Input: "go"}}},
			{Kind: &dispatcherv1.ConnectResponse_Envelope{Envelope: &dispatcherv1.EnvelopeRequest{RequestId: "4", ProtocolHash: "ffffffffffffffffffffffffffffffffffffffff"}}},
		},
	}
	conn := serveDispatcher(t, f)

	ctx, cancel := context.WithCancel(t.Context())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sdk.Connect(ctx, conn, "clients/acme/agents/weather",
			sdk.Protocol(hash, func(_ context.Context, e sdk.Envelope) (json.RawMessage, error) {
				var q map[string]string
				if err := json.Unmarshal(e.Body, &q); err != nil {
					return nil, err
				}
				return json.Marshal(map[string]string{"weatherCondition": "sunny", "location": q["location"]})
			}),
			sdk.NaturalLanguage(func(context.Context, sdk.Envelope) (json.RawMessage, error) {
				return nil, errors.New("no small talk")
			}),
			sdk.Steps(func(_ context.Context, s sdk.Step) (sdk.StepResult, error) {
				return sdk.StepResult{Output: "did " + s.Input, IsLast: true}, nil
			}),
			sdk.OnReady(func() { close(ready) }),
		)
	}()
	hello := recv(t, f.hello, "the agent's hello")
	if hello.GetAgent() != "clients/acme/agents/weather" || len(hello.GetProtocolHashes()) != 1 || !hello.GetNaturalLanguage() || !hello.GetSteps() {
		t.Errorf("hello = %v, want the agent, one hash, NL and steps", hello)
	}
	recv(t, ready, "the ready callback")
	got := map[string]*dispatcherv1.ConnectRequest{}
	for range 4 {
		m := recv(t, f.replies, "a reply")
		if r := m.GetEnvelopeReply(); r != nil {
			got[r.GetRequestId()] = m
		}
		if r := m.GetStepReply(); r != nil {
			got[r.GetRequestId()] = m
		}
	}
	if r := got["1"].GetEnvelopeReply(); string(r.GetBodyJson()) != `{"location":"Paris","weatherCondition":"sunny"}` {
		t.Errorf("reply 1 = %v, want the protocol handler's body", r)
	}
	if r := got["2"].GetEnvelopeReply(); r.GetError() != "no small talk" {
		t.Errorf("reply 2 = %v, want the NL handler's error", r)
	}
	if r := got["3"].GetStepReply(); r.GetOutput() != "did go" || !r.GetIsLast() {
		t.Errorf("reply 3 = %v, want the step's output", r)
	}
	if r := got["4"].GetEnvelopeReply(); r.GetError() == "" {
		t.Errorf("reply 4 = %v, want an error for an unhandled protocol", r)
	}
	cancel()
	if err := recv(t, done, "Connect's return after cancel"); err != nil {
		t.Errorf("Connect after cancel = %v, want nil", err)
	}
}

// keyCheckingDispatcher accepts only the stream carrying want and refuses
// the rest as the real server does.
type keyCheckingDispatcher struct {
	dispatcherv1.UnimplementedDispatcherServiceServer
	want string
}

func (f *keyCheckingDispatcher) Connect(stream dispatcherv1.DispatcherService_ConnectServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	if got := md.Get("authorization"); len(got) == 0 || got[0] != "Bearer "+f.want {
		return status.Error(codes.Unauthenticated, "the key is unknown or revoked")
	}
	return status.Error(codes.PermissionDenied, "this credential may not connect agent x")
}

func TestConnect_sendsKeyAndGivesUpWhenRefused(t *testing.T) {
	f := &keyCheckingDispatcher{want: "parley_ak_good"}
	conn := serveDispatcher(t, f)
	for _, tc := range []struct{ name, key, wantMsg string }{
		{"wrong key", "parley_ak_bad", "unknown or revoked"},
		{"right key, wrong agent", "parley_ak_good", "may not connect"},
	} {
		err := sdk.Connect(t.Context(), conn, "clients/c/agents/x", sdk.Key(tc.key))
		if !errors.Is(err, sdk.ErrNotAuthorized) || !strings.Contains(err.Error(), tc.wantMsg) {
			t.Errorf("Connect(%s) = %v, want ErrNotAuthorized saying %q", tc.name, err, tc.wantMsg)
		}
		if strings.Contains(err.Error(), tc.key) {
			t.Errorf("Connect(%s) error holds the key: %v", tc.name, err)
		}
	}
}

// serveDispatcher serves srv, a test's fake dispatcher, on a loopback
// port and returns a connection to it; both end with the test.
func serveDispatcher(t *testing.T, srv dispatcherv1.DispatcherServiceServer) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	dispatcherv1.RegisterDispatcherServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
