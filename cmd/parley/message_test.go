package main

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
)

// TestSendReplyBroadcast runs `parley send`, `reply` and `broadcast` with
// agent keys against a running suite (real registry, dispatcher and access
// policy): two agents of different clients, one following the other,
// exchange messages, and each refusal holds.
func TestSendReplyBroadcast(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole suite")
	}
	s := startCLISuite(t)
	call, must, operator := s.call, s.must(t), s.operator
	sent := func(token string, args ...string) sendOutput {
		t.Helper()
		var out sendOutput
		if err := json.Unmarshal([]byte(must(token, args...)), &out); err != nil {
			t.Fatalf("parley %q printed no JSON result: %v", args, err)
		}
		return out
	}
	acmeKey := must(operator, "client", "create", "acme")
	betaKey := must(operator, "client", "create", "beta")
	gammaKey := must(operator, "client", "create", "gamma")
	aliceKey := must(acmeKey, "agent", "create", "acme:alice")
	bobKey := must(betaKey, "agent", "create", "beta:bob")
	carolKey := must(gammaKey, "agent", "create", "gamma:carol")

	must(bobKey, "follow", "acme:alice")
	first := sent(aliceKey, "send", "--to", "beta:bob", "--to", "gamma:carol", "Hello, Bob")
	if first.Dialogue == "" || first.Message == "" || first.Category != "message" || len(first.Recipients) != 1 || first.Recipients[0] != "beta:bob" {
		t.Errorf("parley send = %+v, want a dialogue and message id, category message, recipients [beta:bob]", first)
	}
	if len(first.Refused) != 1 || first.Refused[0].Agent != "gamma:carol" || first.Refused[0].Reason != "permission_denied" {
		t.Errorf("parley send refused = %+v, want gamma:carol refused for permission", first.Refused)
	}

	reply := sent(bobKey, "reply", first.Message, "Hi Alice")
	if reply.Dialogue != first.Dialogue || len(reply.Recipients) != 1 || reply.Recipients[0] != "acme:alice" {
		t.Errorf("parley reply = %+v, want to acme:alice in dialogue %s", reply, first.Dialogue)
	}
	// alice received bob's reply, so she may answer it with a JSON body.
	sent(aliceKey, "reply", reply.Message, "--json", `{"when":"tomorrow"}`)

	for _, c := range []struct {
		name   string
		token  string
		args   []string
		code   codes.Code
		reason string
	}{
		{"a recipient that does not follow", aliceKey, []string{"send", "--to", "gamma:carol", "x"}, codes.PermissionDenied, "RECIPIENTS_REFUSED"},
		{"replying to a message not received", carolKey, []string{"reply", first.Message, "x"}, codes.PermissionDenied, "MESSAGE_NOT_RECEIVED"},
		{"an agent key acting as another agent", bobKey, []string{"send", "--as", "acme:alice", "--to", "beta:bob", "x"}, codes.PermissionDenied, ""},
		{"a client key, which acts for no agent", acmeKey, []string{"send", "--as", "acme:alice", "--to", "beta:bob", "x"}, codes.PermissionDenied, ""},
		{"an empty path segment", aliceKey, []string{"send", "--group", "acme//hotel:local", "x"}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"a city without a state", aliceKey, []string{"send", "--group", "acme/hotel:local", "--region", "AU//Sydney", "x"}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"an unknown group", aliceKey, []string{"send", "--group", "acme/nothing:local", "x"}, codes.NotFound, "GROUP_NOT_FOUND"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := call(c.token, c.args...)
			if status.Code(err) != c.code || (c.reason != "" && grpcerr.Reason(err) != c.reason) {
				t.Errorf("parley %q: error = %v (reason %q), want %v %s", c.args, err, grpcerr.Reason(err), c.code, c.reason)
			}
		})
	}

	// A broadcast reaches bob and cannot be answered.
	bc := sent(aliceKey, "broadcast", "--to", "beta:bob", "News")
	if bc.Category != "subscription" || len(bc.Recipients) != 1 {
		t.Errorf("parley broadcast = %+v, want category subscription to bob", bc)
	}
	if _, err := call(bobKey, "reply", bc.Message, "x"); status.Code(err) != codes.PermissionDenied || grpcerr.Reason(err) != "BROADCAST_NOT_ANSWERABLE" {
		t.Errorf("parley reply to a broadcast: error = %v, want PERMISSION_DENIED BROADCAST_NOT_ANSWERABLE", err)
	}
	if _, err := call(aliceKey, "send", "x"); err == nil || !strings.Contains(err.Error(), "--to") {
		t.Errorf("parley send with no recipient: error = %v, want one naming --to", err)
	}
}
