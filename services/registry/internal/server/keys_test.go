package server

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/registry/internal/store/boltstore"
)

func newKeyServer(t *testing.T, opts Options) *Server {
	t.Helper()
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(st, slog.New(slog.DiscardHandler), testOptions(opts))
}

func asOperator(ctx context.Context) context.Context {
	return auth.WithPrincipal(ctx, auth.Principal{Kind: auth.Operator})
}

func TestCreateClient_returnsKeyOnceThatVerifies(t *testing.T) {
	s := newKeyServer(t, Options{})
	ctx := asOperator(t.Context())
	resp, err := s.CreateClient(ctx, &registryv1.CreateClientRequest{ClientId: "acme", Client: &registryv1.Client{DisplayName: "Acme"}})
	if err != nil {
		t.Fatalf("CreateClient: %v", err)
	}
	secret := resp.GetKey().GetSecret()
	if !strings.HasPrefix(secret, auth.ClientKeyPrefix) || !strings.HasPrefix(resp.GetKey().GetName(), "clients/acme/keys/") {
		t.Fatalf("CreateClient key = %v; want a parley_ck_ secret under clients/acme/keys/", resp.GetKey())
	}
	p, err := s.VerifyKey(ctx, secret)
	if err != nil || p != (auth.Principal{Kind: auth.Client, Client: "clients/acme", Key: resp.GetKey().GetName()}) {
		t.Errorf("VerifyKey(client key) = %+v, %v", p, err)
	}
	list, err := s.ListKeys(ctx, &registryv1.ListKeysRequest{Parent: "clients/acme"})
	if err != nil || len(list.GetKeys()) != 1 || list.GetKeys()[0].GetSecret() != "" || list.GetKeys()[0].GetName() != resp.GetKey().GetName() {
		t.Errorf("ListKeys(clients/acme) = %v, %v; want the one key without its secret", list, err)
	}
	_, err = s.CreateClient(ctx, &registryv1.CreateClientRequest{ClientId: "acme"})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("CreateClient(taken) error = %v, want ALREADY_EXISTS", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("an error holds the secret: %v", err)
	}
}

func TestCreateClient_operatorOnlyUnlessOpen(t *testing.T) {
	closed := newKeyServer(t, Options{})
	for name, ctx := range map[string]context.Context{
		"client key": auth.WithPrincipal(t.Context(), auth.Principal{Kind: auth.Client, Client: "clients/x"}),
		"anonymous":  auth.WithPrincipal(t.Context(), auth.Principal{Kind: auth.Anonymous}),
	} {
		_, err := closed.CreateClient(ctx, &registryv1.CreateClientRequest{ClientId: "acme"})
		if status.Code(err) != codes.PermissionDenied || grpcerr.Reason(err) != reasonRegistrationClosed {
			t.Errorf("CreateClient(%s, closed registration) error = %v, want PERMISSION_DENIED %s", name, err, reasonRegistrationClosed)
		}
	}
	if _, err := closed.GetClient(asOperator(t.Context()), &registryv1.GetClientRequest{Name: "clients/acme"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetClient after refused creates error = %v, want NOT_FOUND: a refused call changes nothing", err)
	}

	// Without access control there is no principal: anyone may, as
	// ListClientGroupMembers also reads it.
	if _, err := closed.CreateClient(t.Context(), &registryv1.CreateClientRequest{ClientId: "free"}); err != nil {
		t.Errorf("CreateClient(no principal: access control off): %v, want it created", err)
	}
	if _, err := closed.ListClientGroupMembers(t.Context(), &registryv1.ListClientGroupMembersRequest{Parent: "clients/free"}); err != nil {
		t.Errorf("ListClientGroupMembers(no principal: access control off): %v, want it listed", err)
	}

	open := newKeyServer(t, Options{OpenRegistration: true, RegistrationBurst: 2, RegistrationInterval: 1000 * time.Hour})
	anon := auth.WithRemoteAddr(auth.WithPrincipal(t.Context(), auth.Principal{Kind: auth.Anonymous}), "192.0.2.1")
	for _, id := range []string{"a", "b"} {
		if _, err := open.CreateClient(anon, &registryv1.CreateClientRequest{ClientId: id}); err != nil {
			t.Fatalf("CreateClient(%s, open registration): %v", id, err)
		}
	}
	_, err := open.CreateClient(anon, &registryv1.CreateClientRequest{ClientId: "c"})
	if status.Code(err) != codes.ResourceExhausted || grpcerr.Reason(err) != reasonRegistrationLimit {
		t.Errorf("CreateClient past the registration burst error = %v, want RESOURCE_EXHAUSTED %s", err, reasonRegistrationLimit)
	}
	other := auth.WithRemoteAddr(anon, "192.0.2.2")
	if _, err := open.CreateClient(other, &registryv1.CreateClientRequest{ClientId: "d"}); err != nil {
		t.Errorf("CreateClient from another address: %v; the limit is per address", err)
	}
	if _, err := open.CreateClient(asOperator(t.Context()), &registryv1.CreateClientRequest{ClientId: "e"}); err != nil {
		t.Errorf("CreateClient(operator) past the limit: %v; the operator is not limited", err)
	}
}

func TestCreateClient_validates(t *testing.T) {
	s := newKeyServer(t, Options{})
	_, err := s.CreateClient(asOperator(t.Context()), &registryv1.CreateClientRequest{ClientId: "Bad_ID", Client: &registryv1.Client{DisplayName: strings.Repeat("x", 201)}})
	if got := fieldsOf(err); status.Code(err) != codes.InvalidArgument || len(got) != 2 {
		t.Errorf("CreateClient(bad) = %v (fields %v), want INVALID_ARGUMENT on client_id and client.display_name", err, got)
	}
}

func TestAgentKeys_lifecycle(t *testing.T) {
	s := newKeyServer(t, Options{})
	ctx := asOperator(t.Context())
	a, err := s.CreateAgent(ctx, &registryv1.CreateAgentRequest{
		Parent: "clients/acme", AgentId: "bot", RequestId: "r1",
		Agent: &registryv1.Agent{Owner: &registryv1.Owner{Name: "Ada", Country: "GB", DailyLimitMicroUsd: 5_000_000}},
	})
	if err != nil {
		t.Fatalf("CreateAgent: %v", err)
	}
	first := a.GetInitialKey()
	if !strings.HasPrefix(first.GetSecret(), auth.AgentKeyPrefix) || a.GetOwner().GetCountry() != "GB" {
		t.Fatalf("CreateAgent = %v; want an initial parley_ak_ key and the owner", a)
	}
	got, err := s.GetAgent(ctx, &registryv1.GetAgentRequest{Name: a.GetName()})
	if err != nil || got.GetInitialKey() != nil || got.GetOwner().GetName() != "Ada" {
		t.Errorf("GetAgent = %v, %v; want the owner and no key", got, err)
	}
	again, err := s.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", RequestId: "r1", Agent: &registryv1.Agent{}})
	if err != nil || again.GetInitialKey().GetSecret() != "" {
		t.Errorf("CreateAgent(repeat request id) = %v, %v; want the agent without the secret again", again, err)
	}
	p, err := s.VerifyKey(ctx, first.GetSecret())
	want := auth.Principal{Kind: auth.Agent, Client: "clients/acme", Agent: "clients/acme/agents/bot", Key: first.GetName()}
	if err != nil || p != want {
		t.Errorf("VerifyKey(agent key) = %+v, %v; want %+v", p, err, want)
	}
	second, err := s.CreateKey(ctx, &registryv1.CreateKeyRequest{Parent: a.GetName()})
	if err != nil || second.GetSecret() == "" || second.GetSecret() == first.GetSecret() {
		t.Fatalf("CreateKey = %v, %v; want a new secret", second, err)
	}
	rotated, err := s.RotateKey(ctx, &registryv1.RotateKeyRequest{Name: second.GetName()})
	if err != nil || rotated.GetName() == second.GetName() || !strings.HasPrefix(rotated.GetName(), a.GetName()+"/keys/") {
		t.Fatalf("RotateKey = %v, %v", rotated, err)
	}
	if _, err := s.VerifyKey(ctx, second.GetSecret()); !errors.Is(err, auth.ErrInvalidCredential) {
		t.Errorf("VerifyKey(rotated-away key) error = %v, want ErrInvalidCredential", err)
	}
	if _, err := s.DeleteKey(ctx, &registryv1.DeleteKeyRequest{Name: first.GetName()}); err != nil {
		t.Fatalf("DeleteKey: %v", err)
	}
	resp, err := s.IntrospectKey(ctx, &registryv1.IntrospectKeyRequest{Secret: first.GetSecret()})
	if err != nil || resp.GetActive() {
		t.Errorf("IntrospectKey(revoked) = %v, %v; want inactive", resp, err)
	}
	resp, err = s.IntrospectKey(ctx, &registryv1.IntrospectKeyRequest{Secret: rotated.GetSecret()})
	if err != nil || !resp.GetActive() || resp.GetKind() != registryv1.PrincipalKind_PRINCIPAL_KIND_AGENT || resp.GetAgent() != a.GetName() || resp.GetClient() != "clients/acme" {
		t.Errorf("IntrospectKey(live) = %v, %v", resp, err)
	}
	list, err := s.ListKeys(ctx, &registryv1.ListKeysRequest{Parent: a.GetName()})
	if err != nil || len(list.GetKeys()) != 1 || list.GetKeys()[0].GetName() != rotated.GetName() || list.GetKeys()[0].GetSecret() != "" {
		t.Errorf("ListKeys = %v, %v; want only the rotated key, without its secret", list, err)
	}
	if _, err := s.DeleteKey(ctx, &registryv1.DeleteKeyRequest{Name: first.GetName()}); status.Code(err) != codes.NotFound {
		t.Errorf("DeleteKey(again) error = %v, want NOT_FOUND", err)
	}
}

func TestVerifyKey_refusesForgeries(t *testing.T) {
	s := newKeyServer(t, Options{})
	ctx := asOperator(t.Context())
	a, err := s.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", Agent: &registryv1.Agent{}})
	if err != nil {
		t.Fatal(err)
	}
	secret := a.GetInitialKey().GetSecret()
	last := secret[len(secret)-1]
	flipped := byte('A')
	if last == 'A' {
		flipped = 'B'
	}
	tests := map[string]string{
		"empty":                   "",
		"garbage":                 "Bearer nonsense",
		"right id, wrong secret":  secret[:len(secret)-1] + string(flipped),
		"agent key as client key": auth.ClientKeyPrefix + secret[len(auth.AgentKeyPrefix):],
		"huge":                    strings.Repeat("a", 10000),
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			if p, err := s.VerifyKey(ctx, in); !errors.Is(err, auth.ErrInvalidCredential) {
				t.Errorf("VerifyKey(%s) = %+v, %v; want ErrInvalidCredential", name, p, err)
			}
		})
	}
	if _, err := s.IntrospectKey(ctx, &registryv1.IntrospectKeyRequest{Secret: strings.Repeat("a", 257)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("IntrospectKey(257 bytes) error = %v, want INVALID_ARGUMENT", err)
	}
}

func TestKeys_validateNames(t *testing.T) {
	s := newKeyServer(t, Options{})
	ctx := asOperator(t.Context())
	for _, parent := range []string{"", "clients/", "clients/Acme", "clients/a/agents/", "clients/a/agents/b/keys/x", "clients/-"} {
		if _, err := s.CreateKey(ctx, &registryv1.CreateKeyRequest{Parent: parent}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("CreateKey(parent %q) error = %v, want INVALID_ARGUMENT", parent, err)
		}
	}
	for _, name := range []string{"", "clients/a/keys/XYZ", "clients/a/keys/0123", "clients/a/agents/b/keys/../x"} {
		if _, err := s.DeleteKey(ctx, &registryv1.DeleteKeyRequest{Name: name}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("DeleteKey(%q) error = %v, want INVALID_ARGUMENT", name, err)
		}
	}
	if _, err := s.CreateKey(ctx, &registryv1.CreateKeyRequest{Parent: "clients/nobody/agents/x"}); status.Code(err) != codes.NotFound {
		t.Errorf("CreateKey(missing agent) error = %v, want NOT_FOUND", err)
	}
}

func TestUpdateAgent_owner(t *testing.T) {
	s := newKeyServer(t, Options{})
	ctx := asOperator(t.Context())
	a, err := s.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", Agent: &registryv1.Agent{}})
	if err != nil {
		t.Fatal(err)
	}
	up, err := s.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: a.GetName(), Owner: &registryv1.Owner{Company: "Acme", TransactionLimitMicroUsd: 10}}})
	if err != nil || up.GetOwner().GetCompany() != "Acme" || up.GetInitialKey() != nil {
		t.Errorf("UpdateAgent(owner) = %v, %v", up, err)
	}
	_, err = s.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: a.GetName(), Owner: &registryv1.Owner{Country: "gb", DailyLimitMicroUsd: -1}}})
	if got := fieldsOf(err); status.Code(err) != codes.InvalidArgument || len(got) != 2 {
		t.Errorf("UpdateAgent(bad owner) = %v (fields %v), want INVALID_ARGUMENT on country and daily limit", err, got)
	}
}

func TestUpdateAgent_ownerApprovalKeyAndAutomatedLimits(t *testing.T) {
	s := newKeyServer(t, Options{})
	ctx := asOperator(t.Context())
	a, err := s.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", Agent: &registryv1.Agent{}})
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, ed25519.PublicKeySize)
	key[0] = 7
	good := &registryv1.Owner{ApprovalPublicKey: key, AutomatedLimitPerTransactionMicroUsd: proto.Int64(0), AutomatedLimitPerDayMicroUsd: proto.Int64(5_000_000)}
	up, err := s.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: a.GetName(), Owner: good}})
	if err != nil || !bytes.Equal(up.GetOwner().GetApprovalPublicKey(), key) || up.GetOwner().AutomatedLimitPerTransactionMicroUsd == nil ||
		up.GetOwner().GetAutomatedLimitPerDayMicroUsd() != 5_000_000 {
		t.Fatalf("UpdateAgent(owner with key and limits) = %v, %v", up, err)
	}
	if got, err := s.GetAgent(ctx, &registryv1.GetAgentRequest{Name: a.GetName()}); err != nil || !bytes.Equal(got.GetOwner().GetApprovalPublicKey(), key) ||
		got.GetOwner().GetAutomatedLimitPerTransactionMicroUsd() != 0 || got.GetOwner().AutomatedLimitPerTransactionMicroUsd == nil {
		t.Errorf("GetAgent = %v, %v; want the key and a per-transaction limit of 0 that is set", got, err)
	}
	bad := &registryv1.Owner{ApprovalPublicKey: key[:31], AutomatedLimitPerTransactionMicroUsd: proto.Int64(-1), AutomatedLimitPerDayMicroUsd: proto.Int64(-2)}
	_, err = s.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: a.GetName(), Owner: bad}})
	want := []string{"agent.owner.approval_public_key", "agent.owner.automated_limit_per_transaction_micro_usd", "agent.owner.automated_limit_per_day_micro_usd"}
	if got := fieldsOf(err); status.Code(err) != codes.InvalidArgument || !slices.Equal(got, want) {
		t.Errorf("UpdateAgent(bad key and limits) = %v (fields %v), want INVALID_ARGUMENT on %v", err, got, want)
	}
}

func TestUpdateAgent_agentProtocolAccess(t *testing.T) {
	s := newKeyServer(t, Options{})
	ctx := asOperator(t.Context())
	a, err := s.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", Agent: &registryv1.Agent{}})
	if err != nil {
		t.Fatal(err)
	}
	if got := a.GetAgentProtocolAccess(); got != registryv1.AgentProtocolAccess_AGENT_PROTOCOL_ACCESS_UNSPECIFIED {
		t.Errorf("CreateAgent(no access set).agent_protocol_access = %v, want unspecified (public)", got)
	}
	token := registryv1.AgentProtocolAccess_AGENT_PROTOCOL_ACCESS_TOKEN
	up, err := s.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: a.GetName(), AgentProtocolAccess: token}})
	if err != nil || up.GetAgentProtocolAccess() != token {
		t.Errorf("UpdateAgent(agent_protocol_access TOKEN) = %v, %v", up, err)
	}
	// Changing something else leaves it as it is.
	up, err = s.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: a.GetName(), DisplayName: "Bot"}})
	if err != nil || up.GetAgentProtocolAccess() != token {
		t.Errorf("UpdateAgent(display_name) = %v, %v; want agent_protocol_access still TOKEN", up, err)
	}
	_, err = s.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: a.GetName(), AgentProtocolAccess: 7}})
	if got := fieldsOf(err); status.Code(err) != codes.InvalidArgument || len(got) != 1 || got[0] != "agent.agent_protocol_access" {
		t.Errorf("UpdateAgent(agent_protocol_access 7) = %v (fields %v), want INVALID_ARGUMENT on agent.agent_protocol_access", err, got)
	}
	c, err := s.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "closed", Agent: &registryv1.Agent{AgentProtocolAccess: token}})
	if err != nil || c.GetAgentProtocolAccess() != token {
		t.Errorf("CreateAgent(agent_protocol_access TOKEN) = %v, %v", c, err)
	}
}

// fieldsOf lists the BadRequest fields of a status error.
func fieldsOf(err error) []string {
	var out []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out = append(out, v.GetField())
			}
		}
	}
	return out
}

func TestGetCaller_describesEachKindOfCredential(t *testing.T) {
	s := newKeyServer(t, Options{})
	for _, tc := range []struct {
		name string
		p    auth.Principal
		want *registryv1.Caller
	}{
		{"operator", auth.Principal{Kind: auth.Operator}, &registryv1.Caller{Kind: registryv1.PrincipalKind_PRINCIPAL_KIND_OPERATOR}},
		{"client key", auth.Principal{Kind: auth.Client, Client: "clients/acme", Key: "clients/acme/keys/0123456789abcdef"},
			&registryv1.Caller{Kind: registryv1.PrincipalKind_PRINCIPAL_KIND_CLIENT, Client: "clients/acme", Key: "clients/acme/keys/0123456789abcdef"}},
		{"agent key", auth.Principal{Kind: auth.Agent, Client: "clients/acme", Agent: "clients/acme/agents/bot", Key: "clients/acme/agents/bot/keys/0123456789abcdef"},
			&registryv1.Caller{Kind: registryv1.PrincipalKind_PRINCIPAL_KIND_AGENT, Client: "clients/acme", Agent: "clients/acme/agents/bot", Key: "clients/acme/agents/bot/keys/0123456789abcdef"}},
	} {
		got, err := s.GetCaller(auth.WithPrincipal(t.Context(), tc.p), &registryv1.GetCallerRequest{})
		if err != nil || !proto.Equal(got, tc.want) {
			t.Errorf("GetCaller(%s) = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	for name, ctx := range map[string]context.Context{
		"no principal (access control off)": t.Context(),
		"anonymous":                         auth.WithPrincipal(t.Context(), auth.Principal{Kind: auth.Anonymous}),
	} {
		if _, err := s.GetCaller(ctx, &registryv1.GetCallerRequest{}); status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != reasonNoAccessControl {
			t.Errorf("GetCaller(%s) error = %v, want FAILED_PRECONDITION %s", name, err, reasonNoAccessControl)
		}
	}
}

// testOptions returns o with every limit it leaves zero set to a test
// value: New substitutes no defaults (the registry's config owns them).
func testOptions(o Options) Options {
	if o.MaxBytes == 0 {
		o.MaxBytes = 256 << 10
	}
	if o.ResolveTimeout == 0 {
		o.ResolveTimeout = 5 * time.Second
	}
	if o.RegistrationInterval == 0 {
		o.RegistrationInterval = time.Minute
	}
	if o.RegistrationBurst == 0 {
		o.RegistrationBurst = 3
	}
	return o
}
