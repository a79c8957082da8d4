package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/e2e/parleytest"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
)

// TestPostgreSQL_twoServeProcessesShareOneDatabase runs two `parley serve
// --auth` processes, A and B, with their own data directories on one
// PostgreSQL database (--database-url): a client, an agent and its key
// made through A work on B; a task and an artifact created through A are
// served by B; and a key revoked through A is refused by B on the very next
// call (keys are checked against the database on every call: the bound is
// zero). No service writes a bbolt file: the dispatcher's stores are in
// PostgreSQL too.
func TestPostgreSQL_twoServeProcessesShareOneDatabase(t *testing.T) {
	db := pgdbtest.Database(t)
	a := parleytest.Start(t, "", "--auth", "--database-url", db)
	b := parleytest.Start(t, "", "--auth", "--database-url", db)
	op := parleytest.OperatorToken(t)

	clientKey := strings.TrimSpace(cli(t, a, op, "client", "create", "acme"))
	agentKey := strings.TrimSpace(cli(t, a, clientKey, "agent", "create", "acme:bot"))
	if got := cli(t, b, agentKey, "whoami"); strings.TrimSpace(got) != "agent acme:bot" {
		t.Fatalf("whoami on B with the key made on A = %q, want agent acme:bot", got)
	}

	const tasks = "/agents/acme/bot/ap/v1/agent/tasks"
	var task struct {
		TaskID string `json:"task_id"`
		Input  string `json:"input"`
	}
	if code, body := call(t, a, agentKey, http.MethodPost, tasks, `{"input":"made on A"}`); code != http.StatusOK || json.Unmarshal(body, &task) != nil {
		t.Fatalf("create task on A = %d %s", code, body)
	}
	if code, body := call(t, b, agentKey, http.MethodGet, tasks+"/"+task.TaskID, ""); code != http.StatusOK || !strings.Contains(string(body), "made on A") {
		t.Errorf("get task on B = %d %s; want the task created on A", code, body)
	}

	// Revoke the agent's key through A; B refuses it at once.
	list := cli(t, a, clientKey, "agent", "key", "list", "acme:bot")
	id := strings.Fields(list)[0]
	cli(t, a, clientKey, "agent", "key", "revoke", "acme:bot", id)
	if code, body := call(t, b, agentKey, http.MethodGet, tasks+"/"+task.TaskID, ""); code != http.StatusUnauthorized {
		t.Errorf("get task on B with the key revoked on A = %d %s, want 401", code, body)
	}
	for _, srv := range []*parleytest.Server{a, b} {
		if _, err := os.Stat(filepath.Join(srv.DataDir, "dispatcher.db")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("dispatcher.db in %s: %v; want none, the dispatcher keeps its state in PostgreSQL", srv.DataDir, err)
		}
	}
}

// cli runs the parley CLI against srv with token and returns its stdout;
// a failure fails the test.
func cli(t *testing.T, srv *parleytest.Server, token string, args ...string) string {
	t.Helper()
	cmd := exec.Command(parleytest.Binary(t), args...)
	cmd.Env = append(os.Environ(), "PARLEY_SERVER="+srv.GRPCAddr, "PARLEY_TOKEN="+token)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("parley %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// call makes an HTTP request to srv with token and returns the status and
// body.
func call(t *testing.T, srv *parleytest.Server, token, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL(path), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}
