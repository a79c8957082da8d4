package main

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestGroupCommands runs the `parley group` commands with agent keys
// against a running suite: a restricted_public group, a join request
// accepted by its admin, an invite accepted, search and lists, a
// restricted_private join refused, and leaving.
func TestGroupCommands(t *testing.T) {
	s := startCLISuite(t)
	call, must, operator := s.call, s.must(t), s.operator
	acmeKey := must(operator, "client", "create", "acme")
	betaKey := must(operator, "client", "create", "beta")
	aliceKey := must(acmeKey, "agent", "create", "acme:alice")
	bobKey := must(betaKey, "agent", "create", "beta:bob")
	carolKey := must(betaKey, "agent", "create", "beta:carol")

	must(aliceKey, "group", "create", "acme/club", "--access", "restricted_public", "--category", "message", "--description", "Travel club", "--agent-description", "Ask for trips")
	must(aliceKey, "group", "create", "acme/club/vip", "--access", "restricted_public", "--category", "message")
	must(aliceKey, "group", "create", "acme/secret", "--access", "restricted_private", "--category", "message")
	if _, err := call(aliceKey, "group", "create", "acme/x", "--access", "open", "--category", "message"); err == nil || !strings.Contains(err.Error(), "open_public") {
		t.Errorf("parley group create --access open: error = %v, want the valid values listed", err)
	}
	if _, err := call(bobKey, "group", "join", "acme/secret"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("parley group join (restricted_private) = %v, want PERMISSION_DENIED", err)
	}

	out := must(bobKey, "group", "join", "acme/club", "--region", "FR:IDF:Paris")
	if !strings.Contains(out, `"request"`) {
		t.Errorf("parley group join (restricted_public) printed %s, want a pending request", out)
	}
	if out := must(aliceKey, "group", "requests", "acme/club"); !strings.Contains(out, "clients/beta/agents/bob") {
		t.Errorf("parley group requests printed %s, want bob's request", out)
	}
	must(aliceKey, "group", "accept", "acme/club", "beta:bob")
	if out := must(bobKey, "group", "list"); !strings.Contains(out, `"acme/club"`) || !strings.Contains(out, "Paris") {
		t.Errorf("parley group list (bob) printed %s, want acme/club with his region", out)
	}

	must(carolKey, "follow", "acme:alice")
	must(aliceKey, "group", "invite", "acme/club", "beta:carol", "--admin", "--conditions", "5 EUR")
	if out := must(carolKey, "group", "invites"); !strings.Contains(out, "5 EUR") {
		t.Errorf("parley group invites printed %s, want the invite", out)
	}
	must(carolKey, "group", "accept-invite", "acme/club")
	var admins struct {
		Members []struct{ Group string } `json:"members"`
	}
	if err := json.Unmarshal([]byte(must(carolKey, "group", "list", "--admin")), &admins); err != nil || len(admins.Members) != 1 || admins.Members[0].Group != "acme/club" {
		t.Errorf("parley group list --admin (carol) = %+v, %v; want acme/club", admins, err)
	}

	if out := must(bobKey, "group", "search", "TRIPS"); !strings.Contains(out, `"acme/club"`) || strings.Contains(out, "acme/secret") {
		t.Errorf("parley group search TRIPS printed %s, want acme/club only", out)
	}
	must(bobKey, "group", "leave", "acme/club")
	if out := must(aliceKey, "group", "members", "acme/club"); strings.Contains(out, "bob") || !strings.Contains(out, "carol") {
		t.Errorf("parley group members after bob left printed %s", out)
	}
	if _, err := call(bobKey, "group", "reject", "acme/club", "beta:carol"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("parley group reject by a non-admin = %v, want PERMISSION_DENIED", err)
	}
	if _, err := call(acmeKey, "group", "list"); err == nil || !strings.Contains(err.Error(), "--as") {
		t.Errorf("parley group list with a client key = %v, want a hint at --as", err)
	}
}
