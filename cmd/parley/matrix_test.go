package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcclient"
	"github.com/parleyhq/parley/platform/serve"
)

// The permission matrix: every RPC of every service `parley serve`
// registers, over gRPC and over each of its REST bindings, and every
// hand-written route, called by each kind of caller, with the exact code
// asserted. Refusals follow from the policy table (platform/auth/table.go):
// no credential is UNAUTHENTICATED when the rule does not admit anonymous
// callers; a wrong or revoked key is UNAUTHENTICATED everywhere; a valid
// credential of a kind the rule does not allow, or naming a resource the
// caller does not own, is PERMISSION_DENIED. A call the policy lets through
// reaches its handler, whose code each RPC's row in matrixRPCs states.
//
// The cases are generated from the registered service descriptors and the
// table, so a new RPC is covered as soon as it is registered; one without a
// row in matrixRPCs (or a route without one in matrixRoutes) fails the test.

// caller is one kind of caller in the matrix.
type caller int

const (
	anonymous   caller = iota
	wrongKey           // well formed, with a live key's id, but not its secret
	revokedKey         // a key of the own agent, revoked
	otherClient        // clients/rival's client key
	otherAgent         // clients/acme/agents/peer's key: same client, another agent
	ownAgent           // clients/acme/agents/bot's key
	ownClient          // clients/acme's key
	operator
	numCallers
)

func (c caller) String() string {
	return [...]string{"anonymous", "wrongKey", "revokedKey", "otherClient", "otherAgent", "ownAgent", "ownClient", "operator"}[c]
}

// The fixture's resources. Every target in matrixRPCs is written with
// these placeholders.
const (
	ownAgentName  = "clients/acme/agents/bot"
	ownClientName = "clients/acme"
)

// principal is who c is, for the expected ownership decision.
func (c caller) principal() auth.Principal {
	switch c {
	case otherClient:
		return auth.Principal{Kind: auth.Client, Client: "clients/rival"}
	case otherAgent:
		return auth.Principal{Kind: auth.Agent, Client: ownClientName, Agent: "clients/acme/agents/peer"}
	case ownAgent:
		return auth.Principal{Kind: auth.Agent, Client: ownClientName, Agent: ownAgentName}
	case ownClient:
		return auth.Principal{Kind: auth.Client, Client: ownClientName}
	case operator:
		return auth.Principal{Kind: auth.Operator}
	}
	return auth.Principal{Kind: auth.Anonymous}
}

// outcome is what a call ends with: a code and, for refusals, the auth
// reason.
type outcome struct {
	code   codes.Code
	reason string // auth's ErrorInfo reason; "" when the handler answered
}

func (o outcome) String() string {
	if o.reason == "" {
		return o.code.String()
	}
	return o.code.String() + " " + o.reason
}

// expectedOutcome is what caller c gets from a call under rule, naming
// target (the value of rule.Resource in the request), on either transport:
// the REST middleware reads the resource from the path, the query or the
// decoded body. handler is the handler's answer to a caller the policy
// lets through.
func expectedOutcome(rule auth.Rule, c caller, target string, handler codes.Code) outcome {
	switch c {
	case wrongKey, revokedKey:
		return outcome{codes.Unauthenticated, auth.ReasonInvalid}
	case anonymous:
		if rule.Allow&auth.Anonymous == 0 {
			return outcome{codes.Unauthenticated, auth.ReasonMissing}
		}
		return outcome{code: handler}
	}
	p := c.principal()
	if rule.Allow&p.Kind == 0 {
		return outcome{codes.PermissionDenied, auth.ReasonKind}
	}
	if rule.Resource != "" && p.Kind != auth.Operator && !p.Owns(target) {
		return outcome{codes.PermissionDenied, auth.ReasonNotOwner}
	}
	return outcome{code: handler}
}

// rpcRow is one RPC's row: the request to send and what its handler
// answers callers the policy lets through.
type rpcRow struct {
	// targets are the values put in the rule's resource field, one case
	// set each ("" when the rule names none). Placeholders: {agent} is
	// the own agent, {client} the own client.
	targets []string
	// set fills other request fields (paths to values), before unset path
	// variables are filled with "none" segments.
	set map[string]string
	// ok is the handler's code for callers the policy admits.
	ok codes.Code
	// okFor overrides ok for some callers: decisions the handler makes
	// itself (open registration, a client's group).
	okFor map[caller]codes.Code
}

const (
	reg  = "/parley.registry.v1.RegistryService/"
	disp = "/parley.dispatcher.v1.DispatcherService/"
	neg  = "/parley.negotiator.v1.NegotiatorService/"
	task = "/parley.tasks.v1.TasksService/"
)

var (
	agentT  = []string{"{agent}"}
	clientT = []string{"{client}"}
	// ghost is an agent of the own client that does not exist: deleting
	// or changing it reaches the handler without changing the fixture.
	ghostT = []string{"clients/acme/agents/ghost"}
	noT    = []string{""}
)

// matrixRPCs has a row per RPC. Requests carry little more than the
// resource, so most handlers answer INVALID_ARGUMENT or NOT_FOUND and a
// call that gets through changes nothing the other cases depend on.
var matrixRPCs = map[string]rpcRow{
	reg + "CreateProtocol":  {targets: noT, ok: codes.InvalidArgument},
	reg + "GetProtocol":     {targets: noT, ok: codes.InvalidArgument},
	reg + "ListProtocols":   {targets: noT, ok: codes.OK},
	reg + "SearchProtocols": {targets: noT, ok: codes.InvalidArgument},
	reg + "ResolveProtocol": {targets: noT, ok: codes.InvalidArgument},
	reg + "SyncProtocols":   {targets: noT, ok: codes.OK},

	reg + "CreateAgent":               {targets: clientT, ok: codes.InvalidArgument},
	reg + "GetAgent":                  {targets: agentT, ok: codes.OK},
	reg + "ListAgents":                {targets: clientT, ok: codes.OK},
	reg + "UpdateAgent":               {targets: ghostT, ok: codes.NotFound},
	reg + "DeleteAgent":               {targets: ghostT, ok: codes.NotFound},
	reg + "AddSupportedProtocol":      {targets: agentT, ok: codes.InvalidArgument},
	reg + "RemoveSupportedProtocol":   {targets: agentT, ok: codes.InvalidArgument},
	reg + "AddUnsupportedProtocol":    {targets: agentT, ok: codes.InvalidArgument},
	reg + "RemoveUnsupportedProtocol": {targets: agentT, ok: codes.InvalidArgument},

	// Anyone reaches CreateClient; without --open-registration the handler
	// admits only the operator, who gets INVALID_ARGUMENT for the empty id.
	reg + "CreateClient": {targets: noT, ok: codes.PermissionDenied, okFor: map[caller]codes.Code{operator: codes.InvalidArgument}},
	reg + "GetClient":    {targets: clientT, ok: codes.OK},
	reg + "ListClients":  {targets: noT, ok: codes.OK},
	reg + "CreateKey":    {targets: []string{"clients/acme/agents/ghost", "clients/nobody"}, ok: codes.NotFound},
	reg + "ListKeys":     {targets: []string{"{agent}", "{client}"}, ok: codes.OK},
	reg + "DeleteKey": {targets: []string{"{agent}/keys/0000000000000000", "{client}/keys/0000000000000000"},
		ok: codes.NotFound},
	reg + "RotateKey": {targets: []string{"{agent}/keys/0000000000000000", "{client}/keys/0000000000000000"},
		ok: codes.NotFound},
	reg + "IntrospectKey": {targets: noT, ok: codes.OK},

	reg + "FollowAgent":      {targets: agentT, ok: codes.InvalidArgument},
	reg + "UnfollowAgent":    {targets: agentT, ok: codes.InvalidArgument},
	reg + "ListFollowers":    {targets: agentT, ok: codes.OK},
	reg + "ListFollowing":    {targets: agentT, ok: codes.OK},
	reg + "JoinClientGroup":  {targets: ghostT, ok: codes.NotFound},
	reg + "LeaveClientGroup": {targets: ghostT, ok: codes.NotFound},
	// The handler admits the client's own keys, its agents' too.
	reg + "ListClientGroupMembers":  {targets: noT, set: map[string]string{"parent": "{client}"}, ok: codes.OK, okFor: map[caller]codes.Code{otherClient: codes.PermissionDenied}},
	reg + "CheckDialoguePermission": {targets: noT, ok: codes.InvalidArgument},
	reg + "GetCaller":               {targets: noT, ok: codes.OK},

	// Groups (issue 13): the acting agent is `name`.
	reg + "CreateGroup":            {targets: agentT, ok: codes.InvalidArgument},
	reg + "UpdateGroup":            {targets: agentT, ok: codes.InvalidArgument},
	reg + "GetGroup":               {targets: noT, ok: codes.InvalidArgument},
	reg + "SearchGroups":           {targets: noT, ok: codes.InvalidArgument},
	reg + "JoinGroup":              {targets: agentT, ok: codes.InvalidArgument},
	reg + "LeaveGroup":             {targets: agentT, ok: codes.InvalidArgument},
	reg + "SetGroupRegions":        {targets: agentT, ok: codes.InvalidArgument},
	reg + "InviteToGroup":          {targets: agentT, ok: codes.InvalidArgument},
	reg + "AnswerGroupJoinRequest": {targets: agentT, ok: codes.InvalidArgument},
	reg + "AnswerGroupInvite":      {targets: agentT, ok: codes.InvalidArgument},
	reg + "RemoveGroupMember":      {targets: agentT, ok: codes.InvalidArgument},
	reg + "SetGroupMemberType":     {targets: agentT, ok: codes.InvalidArgument},
	reg + "ListGroupMembers":       {targets: agentT, ok: codes.InvalidArgument},
	reg + "ListAgentGroups":        {targets: agentT, ok: codes.OK},
	reg + "ListGroupJoinRequests":  {targets: agentT, ok: codes.InvalidArgument},
	reg + "ListGroupInvites":       {targets: agentT, ok: codes.OK},
	reg + "ListNotifications":      {targets: agentT, ok: codes.OK},
	reg + "ResolveRecipients":      {targets: noT, ok: codes.InvalidArgument},

	disp + "GetRoutine":      {targets: []string{"{agent}/routines/none"}, ok: codes.InvalidArgument},
	disp + "ListRoutines":    {targets: agentT, ok: codes.OK},
	disp + "SetRoutine":      {targets: []string{"{agent}/routines/none"}, ok: codes.InvalidArgument},
	disp + "SetTool":         {targets: []string{"{agent}/tools/none"}, ok: codes.InvalidArgument},
	disp + "ListTools":       {targets: agentT, ok: codes.OK},
	disp + "Send":            {targets: agentT, ok: codes.InvalidArgument},
	disp + "ListSendCounts":  {targets: agentT, ok: codes.OK},
	disp + "DeliverEnvelope": {targets: noT, ok: codes.OK},
	disp + "Connect":         {targets: noT, ok: codes.InvalidArgument},
	disp + "ExecuteStep":     {targets: noT, ok: codes.InvalidArgument},
	disp + "TestRoutine":     {targets: noT, ok: codes.InvalidArgument},
	// Dialogues (issue 13): the acting agent is the sender.
	disp + "SendMessage":           {targets: agentT, ok: codes.InvalidArgument},
	disp + "ReplyMessage":          {targets: agentT, ok: codes.InvalidArgument},
	disp + "BroadcastMessage":      {targets: agentT, ok: codes.InvalidArgument},
	disp + "CloseDialogue":         {targets: []string{"{agent}/dialogues/none"}, ok: codes.NotFound},
	disp + "CloseDialogueMessages": {targets: []string{"{agent}/dialogues/none"}, ok: codes.InvalidArgument},
	disp + "CloseDialogueAgent":    {targets: []string{"{agent}/dialogues/none"}, ok: codes.InvalidArgument},
	disp + "CloseAllDialogues":     {targets: agentT, ok: codes.OK},
	// Mailboxes (issue 13).
	disp + "ReceiveMessages":     {targets: agentT, ok: codes.OK},
	disp + "AcknowledgeMessages": {targets: agentT, ok: codes.OK},
	// Service requests (issue 14): the acting agent is the consumer.
	disp + "NewRequest": {targets: agentT, ok: codes.InvalidArgument},
	// Orders (issue 14): only the agent named; a missing order is NOT_FOUND.
	disp + "GetOrder":   {targets: []string{"{agent}/orders/none"}, ok: codes.NotFound},
	disp + "ListOrders": {targets: agentT, ok: codes.OK},
	// Payments (issue 14): only the agent named; a missing payment is NOT_FOUND.
	disp + "CreatePayment":  {targets: agentT, ok: codes.InvalidArgument},
	disp + "GetPayment":     {targets: []string{"{agent}/payments/none"}, ok: codes.NotFound},
	disp + "CapturePayment": {targets: []string{"{agent}/payments/none"}, ok: codes.NotFound},

	neg + "GetCostSummary":            {targets: agentT, ok: codes.OK},
	neg + "ListLedgerEntries":         {targets: agentT, ok: codes.OK},
	neg + "ComposeQuery":              {targets: agentT, ok: codes.InvalidArgument},
	neg + "ReplyNaturalLanguage":      {targets: agentT, ok: codes.InvalidArgument},
	neg + "ReplyWithProtocol":         {targets: agentT, ok: codes.InvalidArgument},
	neg + "ParseReply":                {targets: agentT, ok: codes.InvalidArgument},
	neg + "CheckSuitability":          {targets: agentT, ok: codes.InvalidArgument},
	neg + "StartNegotiation":          {targets: agentT, ok: codes.InvalidArgument},
	neg + "SynthesizeRoutine":         {targets: agentT, ok: codes.InvalidArgument},
	neg + "DeriveProtocol":            {targets: noT, ok: codes.InvalidArgument},
	neg + "GetNegotiationProtocol":    {targets: noT, ok: codes.OK},
	neg + "GetThresholds":             {targets: noT, ok: codes.OK},
	neg + "ReceiveNegotiationMessage": {targets: noT, ok: codes.InvalidArgument},
	neg + "GetNegotiation":            {targets: noT, ok: codes.NotFound},
	neg + "GetRoutineCandidate":       {targets: noT, ok: codes.NotFound},
	neg + "ReportShadowResult":        {targets: noT, ok: codes.NotFound},

	task + "CreateTask":     {targets: agentT, ok: codes.OK},
	task + "ListTasks":      {targets: agentT, ok: codes.OK},
	task + "GetTask":        {targets: noT, ok: codes.NotFound},
	task + "CancelTask":     {targets: noT, ok: codes.NotFound},
	task + "CreateStep":     {targets: noT, ok: codes.NotFound},
	task + "GetStep":        {targets: noT, ok: codes.NotFound},
	task + "ListSteps":      {targets: noT, ok: codes.NotFound},
	task + "WatchTask":      {targets: noT, ok: codes.InvalidArgument},
	task + "CreateArtifact": {targets: noT, ok: codes.InvalidArgument},
	task + "GetArtifact":    {targets: noT, ok: codes.NotFound},
	task + "ListArtifacts":  {targets: noT, ok: codes.NotFound},
	task + "ReadArtifact":   {targets: noT, ok: codes.InvalidArgument},

	"/grpc.health.v1.Health/Check":                                   {targets: noT, ok: codes.OK},
	"/grpc.health.v1.Health/Watch":                                   {targets: noT, ok: codes.OK},
	"/grpc.health.v1.Health/List":                                    {targets: noT, ok: codes.OK},
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      {targets: noT, ok: codes.InvalidArgument},
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": {targets: noT, ok: codes.InvalidArgument},
}

// routeRow is a hand-written route's row: a concrete request and the HTTP
// status its handler answers callers the policy lets through.
type routeRow struct {
	path   string // with the pattern's variables filled
	body   string
	ok     int
	target string // the resource the path names, when the rule has one
}

// matrixRoutes has a row per hand-written route. The Agent Protocol
// routes name an agent that does not exist, or a task that does not.
var matrixRoutes = func() map[string]routeRow {
	m := map[string]routeRow{
		"GET /healthz":                                            {path: "/healthz", ok: http.StatusOK},
		"GET /readyz":                                             {path: "/readyz", ok: http.StatusOK},
		"GET /metrics":                                            {path: "/metrics", ok: http.StatusOK},
		"GET /protocols/{hash}":                                   {path: "/protocols/none", ok: http.StatusBadRequest},
		"GET /agora/{client}/{agent}/.wellknown":                  {path: "/agora/acme/ghost/.wellknown", ok: http.StatusNotFound},
		"GET /agora/{client}/{agent}/wellknown":                   {path: "/agora/acme/ghost/wellknown", ok: http.StatusNotFound},
		"POST /agora/{client}/{agent}":                            {path: "/agora/acme/ghost", body: "{}", ok: http.StatusNotFound},
		"POST /agora/{client}/{agent}/{$}":                        {path: "/agora/acme/ghost/", body: "{}", ok: http.StatusNotFound},
		"POST /agora/{client}/{agent}/conversations/{id}":         {path: "/agora/acme/ghost/conversations/none", body: "{}", ok: http.StatusNotFound},
		"DELETE /agora/{client}/{agent}/conversations/{id}":       {path: "/agora/acme/ghost/conversations/none", ok: http.StatusNotFound},
		"GET /v1/clients/{client}/agents/{agent}/messages:stream": {path: "/v1/" + ownAgentName + "/messages:stream", ok: http.StatusOK, target: ownAgentName},
	}
	for _, prefix := range []string{"", "/agents/{client}/{agent}"} {
		path := strings.NewReplacer("{client}", "acme", "{agent}", "ghost").Replace(prefix)
		base := prefix + "/ap/v1/agent/tasks"
		tasks := path + "/ap/v1/agent/tasks"
		for route, row := range map[string]routeRow{
			"POST " + base:                                       {path: tasks, body: "{", ok: http.StatusUnprocessableEntity},
			"GET " + base:                                        {path: tasks, ok: http.StatusOK},
			"GET " + base + "/{task_id}":                         {path: tasks + "/none", ok: http.StatusNotFound},
			"POST " + base + "/{task_id}":                        {path: tasks + "/none", body: "{}", ok: http.StatusNotFound},
			"GET " + base + "/{task_id}/events":                  {path: tasks + "/none/events", ok: http.StatusNotFound},
			"POST " + base + "/{task_id}/steps":                  {path: tasks + "/none/steps", body: "{}", ok: http.StatusNotFound},
			"GET " + base + "/{task_id}/steps":                   {path: tasks + "/none/steps", ok: http.StatusNotFound},
			"GET " + base + "/{task_id}/steps/{step_id}":         {path: tasks + "/none/steps/none", ok: http.StatusNotFound},
			"POST " + base + "/{task_id}/artifacts":              {path: tasks + "/none/artifacts", body: "{}", ok: http.StatusNotFound},
			"GET " + base + "/{task_id}/artifacts":               {path: tasks + "/none/artifacts", ok: http.StatusNotFound},
			"GET " + base + "/{task_id}/artifacts/{artifact_id}": {path: tasks + "/none/artifacts/none", ok: http.StatusNotFound},
		} {
			m[route] = row
		}
	}
	return m
}()

// matrixFixture is a running `parley serve` with the matrix's callers.
type matrixFixture struct {
	conn    *grpc.ClientConn
	httpURL string
	creds   [numCallers]string // the authorization header value per caller
}

func startMatrixSuite(t *testing.T) (*suite, matrixFixture) {
	t.Helper()
	dir := t.TempDir()
	cfg, err := loadSuiteConfig(env{getenv: noEnv, stdout: io.Discard}, []string{"--data", dir, "--log-level", "error"})
	if err != nil {
		t.Fatal(err)
	}
	// Every wrong and revoked key counts as a failed authentication from
	// 127.0.0.1; past the default burst of 20 they would get 429 instead.
	cfg.tune = func(o *serve.Options) { o.AuthFailBurst = 1 << 20 }
	s, grpcAddr, httpURL := startSuite(t, cfg)
	op, err := os.ReadFile(filepath.Join(dir, "operator.token"))
	if err != nil {
		t.Fatal(err)
	}
	fx := matrixFixture{httpURL: httpURL}
	fx.creds[operator] = strings.TrimSpace(string(op))
	admin, err := grpcclient.Dial(grpcAddr, grpcclient.Options{Token: fx.creds[operator]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	reg := registryv1.NewRegistryServiceClient(admin)
	ctx := t.Context()
	for id, c := range map[string]caller{"acme": ownClient, "rival": otherClient} {
		resp, err := reg.CreateClient(ctx, &registryv1.CreateClientRequest{ClientId: id})
		if err != nil {
			t.Fatal(err)
		}
		fx.creds[c] = resp.GetKey().GetSecret()
	}
	for id, c := range map[string]caller{"bot": ownAgent, "peer": otherAgent} {
		a, err := reg.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: ownClientName, AgentId: id, Agent: &registryv1.Agent{}})
		if err != nil {
			t.Fatal(err)
		}
		fx.creds[c] = a.GetInitialKey().GetSecret()
	}
	// The own agent serves its Agent Protocol routes to its keys only.
	if _, err := reg.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: ownAgentName, AgentProtocolAccess: registryv1.AgentProtocolAccess_AGENT_PROTOCOL_ACCESS_TOKEN}}); err != nil {
		t.Fatal(err)
	}
	k, err := reg.CreateKey(ctx, &registryv1.CreateKeyRequest{Parent: ownAgentName})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.DeleteKey(ctx, &registryv1.DeleteKeyRequest{Name: k.GetName()}); err != nil {
		t.Fatal(err)
	}
	fx.creds[revokedKey] = k.GetSecret()
	// The own agent's key id with another secret of the right shape.
	own := fx.creds[ownAgent]
	last := "A"
	if strings.HasSuffix(own, "A") {
		last = "B"
	}
	fx.creds[wrongKey] = own[:len(own)-1] + last
	for c := range numCallers {
		if c != anonymous {
			fx.creds[c] = "Bearer " + fx.creds[c]
		}
	}
	fx.conn, err = grpcclient.Dial(grpcAddr, grpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fx.conn.Close() })
	return s, fx
}

// TestPermissionMatrix calls every RPC (gRPC and REST) and every route as
// each kind of caller and checks the exact code.
func TestPermissionMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a suite and makes some 1,500 calls")
	}
	s, fx := startMatrixSuite(t)
	policy := auth.ParleyPolicy()

	var methods []string
	for name, info := range s.srv.GRPC.GetServiceInfo() {
		for _, m := range info.Methods {
			methods = append(methods, "/"+name+"/"+m.Name)
		}
	}
	slices.Sort(methods)
	for _, m := range methods {
		if _, ok := matrixRPCs[m]; !ok {
			t.Errorf("%s has no row in matrixRPCs (cmd/parley/matrix_test.go): add the request target and its handler's code", m)
		}
	}
	for m := range matrixRPCs {
		if !slices.Contains(methods, m) {
			t.Errorf("matrixRPCs has a row for %s, which `parley serve` does not register", m)
		}
	}
	routes := s.srv.Routes()
	for _, r := range routes {
		if _, ok := matrixRoutes[r]; !ok {
			t.Errorf("route %q has no row in matrixRoutes (cmd/parley/matrix_test.go)", r)
		}
	}

	cases := 0
	for _, m := range methods {
		row, ok := matrixRPCs[m]
		if !ok {
			continue
		}
		md, err := methodDescriptor(m)
		if err != nil {
			t.Fatal(err)
		}
		rule, hasRule := policy[m]
		for _, target := range row.targets {
			target = expand(target)
			req, err := buildRequest(md, rule.Resource, target, row.set)
			if err != nil {
				t.Fatalf("%s: %v", m, err)
			}
			for c := range numCallers {
				handler := row.ok
				if o, ok := row.okFor[c]; ok {
					handler = o
				}
				want := expectedOutcome(rule, c, target, handler)
				if !hasRule {
					want = outcome{codes.PermissionDenied, auth.ReasonNoPolicy}
				}
				got := callGRPC(t.Context(), fx.conn, md, m, req, fx.creds[c])
				cases++
				if got != want {
					t.Errorf("gRPC %s(%s) as %s = %s, want %s", m, target, c, got, want)
				}
				for _, b := range restBindings(md) {
					hreq, ok, err := b.request(fx.httpURL, req)
					if err != nil {
						t.Fatalf("%s %s: %v", m, b.pattern, err)
					}
					if !ok {
						continue // this binding's pattern does not match target
					}
					want := expectedOutcome(rule, c, target, handler)
					if !hasRule {
						want = outcome{codes.PermissionDenied, auth.ReasonNoPolicy}
					}
					got := callREST(t.Context(), hreq, fx.creds[c])
					cases++
					if got.status != runtime.HTTPStatusFromCode(want.code) || got.reason != want.reason {
						t.Errorf("REST %s %s (%s) as %s = %d %s, want %d %s", b.verb, hreq.URL.Path, m, c, got.status, got.reason, runtime.HTTPStatusFromCode(want.code), want)
					}
				}
			}
		}
	}
	for _, route := range routes {
		row, ok := matrixRoutes[route]
		if !ok {
			continue
		}
		rule, hasRule := policy[route]
		verb, _, _ := strings.Cut(route, " ")
		for c := range numCallers {
			want := expectedOutcome(rule, c, row.target, codes.OK)
			if !hasRule {
				want = outcome{codes.PermissionDenied, auth.ReasonNoPolicy}
			}
			wantStatus := runtime.HTTPStatusFromCode(want.code)
			if want.reason == "" {
				wantStatus = row.ok
			}
			var body io.Reader
			if row.body != "" {
				body = strings.NewReader(row.body)
			}
			hreq, err := http.NewRequest(verb, fx.httpURL+row.path, body)
			if err != nil {
				t.Fatal(err)
			}
			if row.body != "" {
				hreq.Header.Set("Content-Type", "application/json")
			}
			got := callREST(t.Context(), hreq, fx.creds[c])
			cases++
			if got.status != wantStatus || got.reason != want.reason {
				t.Errorf("route %s (%s %s) as %s = %d %s, want %d %s", route, verb, row.path, c, got.status, got.reason, wantStatus, want.reason)
			}
		}
	}
	// The Agent Protocol routes of an agent with token access (the own
	// agent): the table lets anyone through, then the routes admit only the
	// agent's key, its client's key and the operator. Their refusals are
	// the spec's {"message"} shape, without a reason.
	token := auth.Rule{Allow: auth.AnyKey, Resource: "agent"}
	for _, route := range routes {
		row, ok := matrixRoutes[route]
		if !ok || !strings.HasPrefix(route, "POST /agents/") && !strings.HasPrefix(route, "GET /agents/") {
			continue
		}
		verb, _, _ := strings.Cut(route, " ")
		path := strings.Replace(row.path, "/agents/acme/ghost/", "/agents/acme/bot/", 1)
		for c := range numCallers {
			want := expectedOutcome(token, c, ownAgentName, codes.OK)
			wantStatus := runtime.HTTPStatusFromCode(want.code)
			if want.reason == "" {
				wantStatus = row.ok
			}
			if c != wrongKey && c != revokedKey {
				want.reason = "" // refused by the route, not the table
			}
			var body io.Reader
			if row.body != "" {
				body = strings.NewReader(row.body)
			}
			hreq, err := http.NewRequest(verb, fx.httpURL+path, body)
			if err != nil {
				t.Fatal(err)
			}
			got := callREST(t.Context(), hreq, fx.creds[c])
			cases++
			if got.status != wantStatus || got.reason != want.reason {
				t.Errorf("route %s (%s %s, token access) as %s = %d %s, want %d %s", route, verb, path, c, got.status, got.reason, wantStatus, want.reason)
			}
		}
	}
	t.Logf("%d calls checked", cases)
}

// TestPermissionMatrix_publicCallsAreTheListedOnes pins, apart from the
// table, which calls anonymous callers may make: the ones public by design
// (issue 12). A rule opened by mistake fails here even though the matrix,
// which follows the table, would agree with it.
func TestPermissionMatrix_publicCallsAreTheListedOnes(t *testing.T) {
	public := []string{
		reg + "GetProtocol", reg + "ListProtocols", reg + "SearchProtocols",
		reg + "CreateClient", // the handler admits only the operator without --open-registration
		neg + "GetNegotiationProtocol",
		"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch", "/grpc.health.v1.Health/List",
		"GET /healthz", "GET /readyz", "GET /protocols/{hash}",
	}
	var got []string
	for call, rule := range auth.ParleyPolicy() {
		if rule.Allow&auth.Anonymous == 0 || strings.Contains(call, "/agora/") || strings.Contains(call, "/ap/v1/") {
			continue
		}
		got = append(got, call)
	}
	slices.Sort(got)
	slices.Sort(public)
	if !slices.Equal(got, public) {
		t.Errorf("calls open to anonymous callers (besides /agora and the Agent Protocol):\n got %q\nwant %q", got, public)
	}
}

// expand fills a target's placeholders.
func expand(target string) string {
	return strings.NewReplacer("{agent}", ownAgentName, "{client}", ownClientName).Replace(target)
}

func methodDescriptor(full string) (protoreflect.MethodDescriptor, error) {
	svc, method, _ := strings.Cut(strings.TrimPrefix(full, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", svc, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("%s is not a service", svc)
	}
	md := sd.Methods().ByName(protoreflect.Name(method))
	if md == nil {
		return nil, fmt.Errorf("%s has no method %s", svc, method)
	}
	return md, nil
}

func newMessage(d protoreflect.MessageDescriptor) (proto.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName())
	if err != nil {
		return nil, err
	}
	return mt.New().Interface(), nil
}

// buildRequest is md's request with field (a dotted path; "" none) set to
// target, the fields of set set, and every variable of its REST bindings'
// first pattern that is still unset filled with "none" segments, so that
// gRPC and REST send the same request.
func buildRequest(md protoreflect.MethodDescriptor, field, target string, set map[string]string) (proto.Message, error) {
	req, err := newMessage(md.Input())
	if err != nil {
		return nil, err
	}
	if field != "" {
		if err := setField(req.ProtoReflect(), field, target); err != nil {
			return nil, err
		}
	}
	for f, v := range set {
		if err := setField(req.ProtoReflect(), f, expand(v)); err != nil {
			return nil, err
		}
	}
	if bs := restBindings(md); len(bs) > 0 {
		for _, v := range bs[0].vars {
			if getField(req.ProtoReflect(), v.field) == "" {
				if err := setField(req.ProtoReflect(), v.field, strings.NewReplacer("**", "none", "*", "none").Replace(v.pattern)); err != nil {
					return nil, err
				}
			}
		}
	}
	return req, nil
}

func setField(m protoreflect.Message, path, value string) error {
	parts := strings.Split(path, ".")
	for i, part := range parts {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(part))
		if fd == nil {
			return fmt.Errorf("%s has no field %q", m.Descriptor().FullName(), part)
		}
		if i == len(parts)-1 {
			if fd.Kind() != protoreflect.StringKind || fd.IsList() {
				return fmt.Errorf("field %s is not a string", path)
			}
			m.Set(fd, protoreflect.ValueOfString(value))
			return nil
		}
		m = m.Mutable(fd).Message()
	}
	return nil
}

func getField(m protoreflect.Message, path string) string {
	parts := strings.Split(path, ".")
	for i, part := range parts {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(part))
		if fd == nil {
			return ""
		}
		if i == len(parts)-1 {
			if fd.Kind() != protoreflect.StringKind || fd.IsList() {
				return ""
			}
			return m.Get(fd).String()
		}
		if !m.Has(fd) {
			return ""
		}
		m = m.Get(fd).Message()
	}
	return ""
}

// callGRPC makes one call with the authorization header value cred (""
// none) and returns its outcome. Streams send req, close their side and
// read one message.
func callGRPC(ctx context.Context, conn *grpc.ClientConn, md protoreflect.MethodDescriptor, method string, req proto.Message, cred string) outcome {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if cred != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", cred)
	}
	resp, err := newMessage(md.Output())
	if err != nil {
		return outcome{code: codes.Internal, reason: err.Error()}
	}
	if !md.IsStreamingClient() && !md.IsStreamingServer() {
		err = conn.Invoke(ctx, method, req, resp)
	} else {
		err = func() error {
			st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: md.IsStreamingServer(), ClientStreams: md.IsStreamingClient()}, method)
			if err != nil {
				return err
			}
			if err := st.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			if err := st.CloseSend(); err != nil {
				return err
			}
			return st.RecvMsg(resp)
		}()
	}
	return outcomeOf(err)
}

// outcomeOf reads err's code and, for auth's refusals, the reason.
func outcomeOf(err error) outcome {
	st := status.Convert(err)
	o := outcome{code: st.Code()}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == auth.Domain {
			o.reason = info.GetReason()
		}
	}
	return o
}

// restBinding is one google.api.http binding of an RPC.
type restBinding struct {
	verb, pattern, body string
	vars                []pathVar
}

// pathVar is a path variable: the request field and its segment pattern.
type pathVar struct{ field, pattern string }

var pathVarRE = regexp.MustCompile(`\{([a-zA-Z0-9_.]+)(?:=([^}]+))?\}`)

func restBindings(md protoreflect.MethodDescriptor) []restBinding {
	rule, _ := proto.GetExtension(md.Options(), annotations.E_Http).(*annotations.HttpRule)
	if rule == nil {
		return nil
	}
	var out []restBinding
	for _, r := range append([]*annotations.HttpRule{rule}, rule.GetAdditionalBindings()...) {
		verb, pattern := httpRule(r)
		b := restBinding{verb: verb, pattern: pattern, body: r.GetBody()}
		for _, m := range pathVarRE.FindAllStringSubmatch(pattern, -1) {
			p := m[2]
			if p == "" {
				p = "*"
			}
			b.vars = append(b.vars, pathVar{field: m[1], pattern: p})
		}
		out = append(out, b)
	}
	return out
}

func httpRule(r *annotations.HttpRule) (verb, pattern string) {
	switch p := r.GetPattern().(type) {
	case *annotations.HttpRule_Get:
		return http.MethodGet, p.Get
	case *annotations.HttpRule_Post:
		return http.MethodPost, p.Post
	case *annotations.HttpRule_Put:
		return http.MethodPut, p.Put
	case *annotations.HttpRule_Patch:
		return http.MethodPatch, p.Patch
	case *annotations.HttpRule_Delete:
		return http.MethodDelete, p.Delete
	}
	return "", ""
}

// segmentRE turns a path variable's pattern into a regexp.
func segmentRE(pattern string) *regexp.Regexp {
	parts := strings.Split(pattern, "/")
	for i, p := range parts {
		switch p {
		case "*":
			parts[i] = `[^/]+`
		case "**":
			parts[i] = `.+`
		default:
			parts[i] = regexp.QuoteMeta(p)
		}
	}
	return regexp.MustCompile(`^` + strings.Join(parts, "/") + `$`)
}

// request is req as this binding sends it, and false when req's values do
// not match the binding's path pattern.
func (b restBinding) request(base string, req proto.Message) (*http.Request, bool, error) {
	m := req.ProtoReflect()
	path := b.pattern
	inPath := map[string]bool{}
	for _, v := range b.vars {
		val := getField(m, v.field)
		if !segmentRE(v.pattern).MatchString(val) {
			return nil, false, nil
		}
		inPath[v.field] = true
		path = pathVarRE.ReplaceAllStringFunc(path, func(s string) string {
			if pathVarRE.FindStringSubmatch(s)[1] != v.field {
				return s
			}
			return val
		})
	}
	var body []byte
	query := url.Values{}
	var err error
	switch b.body {
	case "":
	case "*":
		body, err = protojson.Marshal(req)
	default:
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(b.body))
		if fd == nil {
			return nil, false, fmt.Errorf("no body field %q", b.body)
		}
		if fd.Message() != nil {
			body, err = protojson.Marshal(m.Get(fd).Message().Interface())
		} else {
			body, err = json.Marshal(m.Get(fd).Interface())
		}
	}
	if err != nil {
		return nil, false, err
	}
	if b.body != "*" {
		addQuery(query, m, "", inPath, b.body)
	}
	u := base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	hreq, err := http.NewRequest(b.verb, u, r)
	if err != nil {
		return nil, false, err
	}
	if body != nil {
		hreq.Header.Set("Content-Type", "application/json")
	}
	return hreq, true, nil
}

// addQuery adds m's set string fields, except those in the path and the
// body, as query parameters.
func addQuery(q url.Values, m protoreflect.Message, prefix string, inPath map[string]bool, bodyField string) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := prefix + string(fd.Name())
		switch {
		case inPath[name], name == bodyField:
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			addQuery(q, v.Message(), name+".", inPath, bodyField)
		case fd.Kind() == protoreflect.StringKind && !fd.IsList():
			q.Set(name, v.String())
		}
		return true
	})
}

// restOutcome is an HTTP status and, for auth's refusals, the reason.
type restOutcome struct {
	status int
	reason string
}

// callREST sends hreq with the authorization header value cred ("" none).
// It reads the status and, for errors, the reason in the JSON body; a
// streaming answer is cut once its headers arrive.
func callREST(ctx context.Context, hreq *http.Request, cred string) restOutcome {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	hreq = hreq.WithContext(ctx)
	if cred != "" {
		hreq.Header.Set("Authorization", cred)
	}
	if hreq.GetBody != nil { // the request may be sent once per caller
		hreq.Body, _ = hreq.GetBody()
	}
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return restOutcome{status: -1, reason: err.Error()}
	}
	defer resp.Body.Close()
	out := restOutcome{status: resp.StatusCode}
	if resp.StatusCode < 400 {
		return out
	}
	var st struct {
		Details []struct {
			Type   string `json:"@type"`
			Reason string `json:"reason"`
			Domain string `json:"domain"`
		} `json:"details"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	_ = json.Unmarshal(b, &st)
	for _, d := range st.Details {
		if d.Domain == auth.Domain {
			out.reason = d.Reason
		}
	}
	return out
}

// startSuite runs cfg's suite on 127.0.0.1 and returns it with its gRPC
// address and HTTP base URL; it stops when the test ends.
func startSuite(t testing.TB, cfg suiteConfig) (*suite, string, string) {
	t.Helper()
	s, err := newSuite(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.srv.Run(ctx, gl, hl) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
		s.Close()
	})
	return s, gl.Addr().String(), "http://" + hl.Addr().String()
}

// TestTaskOwnership: the calls on an existing task answer its agent, its
// client and the operator, over gRPC and REST; anyone else gets NOT_FOUND,
// as for a task that does not exist, and changes nothing.
func TestTaskOwnership(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a suite")
	}
	_, fx := startMatrixSuite(t)
	tasks := tasksv1.NewTasksServiceClient(fx.conn)
	as := func(c caller) context.Context {
		return metadata.AppendToOutgoingContext(t.Context(), "authorization", fx.creds[c])
	}
	task, err := tasks.CreateTask(as(ownAgent), &tasksv1.CreateTaskRequest{Task: &tasksv1.Task{Agent: ownAgentName}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[caller]codes.Code{
		otherClient: codes.NotFound, otherAgent: codes.NotFound,
		ownAgent: codes.OK, ownClient: codes.OK, operator: codes.OK,
	}
	for c, code := range want {
		if _, err := tasks.GetTask(as(c), &tasksv1.GetTaskRequest{Name: task.GetName()}); status.Code(err) != code {
			t.Errorf("GetTask(%s) as %s = %v, want %s", task.GetName(), c, err, code)
		}
		if _, err := tasks.ListSteps(as(c), &tasksv1.ListStepsRequest{Parent: task.GetName()}); status.Code(err) != code {
			t.Errorf("ListSteps(%s) as %s = %v, want %s", task.GetName(), c, err, code)
		}
		hreq, err := http.NewRequest(http.MethodGet, fx.httpURL+"/v1/"+task.GetName(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := callREST(t.Context(), hreq, fx.creds[c]); got.status != runtime.HTTPStatusFromCode(code) {
			t.Errorf("GET /v1/%s as %s = %d, want %d", task.GetName(), c, got.status, runtime.HTTPStatusFromCode(code))
		}
	}
	// A refused change changes nothing.
	if _, err := tasks.CancelTask(as(otherAgent), &tasksv1.CancelTaskRequest{Name: task.GetName()}); status.Code(err) != codes.NotFound {
		t.Errorf("CancelTask as %s = %v, want NOT_FOUND", otherAgent, err)
	}
	got, err := tasks.GetTask(as(operator), &tasksv1.GetTaskRequest{Name: task.GetName()})
	if err != nil || got.GetState() != task.GetState() {
		t.Errorf("task after a refused CancelTask = %v, %v; want state %v unchanged", got, err, task.GetState())
	}
	if _, err := tasks.CancelTask(as(ownClient), &tasksv1.CancelTaskRequest{Name: task.GetName()}); err != nil {
		t.Errorf("CancelTask as %s: %v", ownClient, err)
	}
}
