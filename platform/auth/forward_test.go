package auth

import (
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
)

// TestForwardedCaller_believedOnlyFromAService: over a plain connection
// (no client certificate), a forwarded caller counts only beside the
// operator token, and then with that caller's rights alone. The mTLS side
// is e2e's TestSeparateProcesses_mTLS.
func TestForwardedCaller_believedOnlyFromAService(t *testing.T) {
	f := newFixture(t, ownedCheck, 100)
	bot := ForwardedCaller(Principal{Kind: Agent, Client: "clients/acme", Agent: "clients/acme/agents/bot"})
	mine, other := "clients/acme/agents/bot", "clients/evil/agents/x"
	tests := []struct {
		name      string
		header    string
		forwarded string
		service   string
		code      codes.Code
		reason    string
	}{
		{"plain header alone", "", bot, mine, codes.Unauthenticated, ReasonForwardUntrusted},
		{"beside the agent's own key", "Bearer " + f.agentKey, bot, mine, codes.Unauthenticated, ReasonForwardUntrusted},
		{"beside a wrong operator token", "Bearer " + OperatorPrefix + "x", bot, mine, codes.Unauthenticated, ReasonInvalid},
		{"operator forwards the agent, own resource", "Bearer " + f.operator, bot, mine, codes.OK, ""},
		{"operator forwards the agent, another's resource", "Bearer " + f.operator, bot, other, codes.PermissionDenied, ReasonNotOwner},
		{"operator forwards an operator", "Bearer " + f.operator, "operator x", other, codes.Unauthenticated, ReasonMalformed},
		{"operator forwards a bad name", "Bearer " + f.operator, "agent clients/acme/bot", mine, codes.Unauthenticated, ReasonMalformed},
		{"operator forwards a client, not allowed here", "Bearer " + f.operator, "client clients/acme", mine, codes.PermissionDenied, ReasonKind},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := metadata.AppendToOutgoingContext(withAuth(t.Context(), tt.header), ForwardedCallerHeader, tt.forwarded)
			_, err := f.health.Check(ctx, &healthpb.HealthCheckRequest{Service: tt.service})
			if status.Code(err) != tt.code || grpcerr.Reason(err) != tt.reason {
				t.Errorf("Check = %v (reason %q), want %v %q", err, grpcerr.Reason(err), tt.code, tt.reason)
			}
		})
	}
}

func TestForwardedCaller_roundTrip(t *testing.T) {
	for _, p := range []Principal{
		{Kind: Agent, Client: "clients/acme", Agent: "clients/acme/agents/bot"},
		{Kind: Client, Client: "clients/acme"},
	} {
		got, ok := parseForwardedCaller(ForwardedCaller(p))
		if !ok || got != p {
			t.Errorf("parse(ForwardedCaller(%+v)) = %+v, %v", p, got, ok)
		}
	}
	for _, p := range []Principal{{Kind: Operator}, {Kind: Anonymous}} {
		if v := ForwardedCaller(p); v != "" {
			t.Errorf("ForwardedCaller(%v) = %q, want nothing: only agents and clients are forwarded", p.Kind, v)
		}
	}
}
