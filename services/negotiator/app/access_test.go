package app_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/negotiator/app"
	"github.com/parleyhq/parley/services/negotiator/config"
)

// keyed is a negotiator with access control on (auth.ParleyPolicy) and a
// key for each kind of caller the tests need.
type keyed struct {
	negotiator
	keys map[string]string // caller → bearer credential
}

// startKeyedNegotiator runs a negotiator with the Parley policy. Its keys
// are checked by a verifier standing in for the registry: alice's and
// carol's agent keys (both of clients/tours), the tours client's key, the
// rival client's key, and the operator token.
func startKeyedNegotiator(t *testing.T) keyed {
	t.Helper()
	dir := t.TempDir()
	cfg, err := config.Load([]string{"--data", dir}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	operator, _, _, err := auth.LoadOperatorToken("", dir)
	if err != nil {
		t.Fatal(err)
	}
	principals := map[[32]byte]auth.Principal{}
	keys := map[string]string{"operator": operator}
	for name, p := range map[string]auth.Principal{
		"alice": {Kind: auth.Agent, Client: "clients/tours", Agent: alice},
		"carol": {Kind: auth.Agent, Client: "clients/tours", Agent: "clients/tours/agents/carol"},
		"tours": {Kind: auth.Client, Client: "clients/tours"},
		"rival": {Kind: auth.Client, Client: "clients/rival"},
	} {
		secret, _, hash, err := auth.NewKey(p.Kind)
		if err != nil {
			t.Fatal(err)
		}
		principals[hash], keys[name] = p, secret
	}
	logger := slog.New(slog.DiscardHandler)
	a, err := app.New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	srv, err := serve.New(serve.Options{Logger: logger, Policy: auth.ParleyPolicy(), DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetKeyVerifier(auth.VerifierFunc(func(_ context.Context, secret string) (auth.Principal, error) {
		if p, ok := principals[auth.HashSecret(secret)]; ok {
			return p, nil
		}
		return auth.Principal{}, auth.ErrInvalidCredential
	}))
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Register(ctx, srv); err != nil {
		t.Fatal(err)
	}
	grpcLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, grpcLis, httpLis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	conn, err := grpc.NewClient(grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return keyed{negotiator{client: negotiatorv1.NewNegotiatorServiceClient(conn), url: "http://" + httpLis.Addr().String()}, keys}
}

// as returns a context calling as who.
func (k keyed) as(ctx context.Context, who string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+k.keys[who])
}

// TestNegotiations_actedOnByTheirAgentOnly: a negotiation is read and
// advanced by its agent, its client and the operator. Another agent of the
// same client, or another client, gets NOT_FOUND, the same answer as for a
// negotiation that does not exist, on gRPC and on REST; its message
// changes nothing. Opening the receiving side for another agent is
// PERMISSION_DENIED, as the request names that agent.
func TestNegotiations_actedOnByTheirAgentOnly(t *testing.T) {
	n := startKeyedNegotiator(t)
	ctx := t.Context()
	started, err := n.client.StartNegotiation(n.as(ctx, "alice"), &negotiatorv1.StartNegotiationRequest{Agent: alice, Peer: bob, Task: weatherTask})
	if err != nil {
		t.Fatalf("StartNegotiation as alice: %v", err)
	}
	name := started.GetName()
	const missing = "negotiations/00000000000000000000000000000000"

	for _, who := range []string{"alice", "tours", "operator"} {
		got, err := n.client.GetNegotiation(n.as(ctx, who), &negotiatorv1.GetNegotiationRequest{Name: name})
		if err != nil || got.GetAgent() != alice {
			t.Errorf("GetNegotiation(%s) as %s = %v, %v; want alice's negotiation", name, who, got, err)
		}
	}
	for _, who := range []string{"carol", "rival"} {
		for _, target := range []string{name, missing} {
			_, err := n.client.GetNegotiation(n.as(ctx, who), &negotiatorv1.GetNegotiationRequest{Name: target})
			if status.Code(err) != codes.NotFound {
				t.Errorf("GetNegotiation(%s) as %s = %v, want NOT_FOUND", target, who, err)
			}
		}
		_, err := n.client.ReceiveNegotiationMessage(n.as(ctx, who), &negotiatorv1.ReceiveNegotiationMessageRequest{Name: name, BodyJson: []byte(`{"type":"accept"}`)})
		if status.Code(err) != codes.NotFound {
			t.Errorf("ReceiveNegotiationMessage(%s) as %s = %v, want NOT_FOUND", name, who, err)
		}
		_, err = n.client.ReceiveNegotiationMessage(n.as(ctx, who), &negotiatorv1.ReceiveNegotiationMessageRequest{Agent: alice, Peer: bob, BodyJson: started.GetOutboundMessageJson()})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("ReceiveNegotiationMessage(new, agent %s) as %s = %v, want PERMISSION_DENIED", alice, who, err)
		}
	}
	after, err := n.client.GetNegotiation(n.as(ctx, "operator"), &negotiatorv1.GetNegotiationRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(started, after, protocmp.Transform(), protocmp.IgnoreFields(&negotiatorv1.Negotiation{}, "outbound_message_json")); diff != "" {
		t.Errorf("the negotiation changed after refused calls (-before +after):\n%s", diff)
	}

	// The receiving side for its own agent.
	if _, err := n.client.ReceiveNegotiationMessage(n.as(ctx, "alice"), &negotiatorv1.ReceiveNegotiationMessageRequest{Agent: alice, Peer: bob, BodyJson: started.GetOutboundMessageJson()}); err != nil {
		t.Errorf("ReceiveNegotiationMessage(new, agent alice) as alice: %v", err)
	}

	for _, tc := range []struct {
		who, path string
		want      int
	}{
		{"alice", "/v1/" + name, http.StatusOK},
		{"tours", "/v1/" + name, http.StatusOK},
		{"carol", "/v1/" + name, http.StatusNotFound},
		{"rival", "/v1/" + name, http.StatusNotFound},
		{"carol", "/v1/" + missing, http.StatusNotFound},
	} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.url+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+n.keys[tc.who])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s as %s = %d, want %d", tc.path, tc.who, resp.StatusCode, tc.want)
		}
	}
}
