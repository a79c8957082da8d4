package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/parleyhq/parley/e2e/parleytest"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/tlstest"
)

// TestSecrets_neverLogged creates a client and agent keys on a real
// `parley serve` at debug level, uses them rightly and wrongly, revokes
// one, and then greps everything the server logged for each secret.
func TestSecrets_neverLogged(t *testing.T) {
	srv := parleytest.Start(t, "", "--log-level", "debug")
	as := func(token, method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL(path), strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}
	_, raw := as(parleytest.OperatorToken(t), "POST", "/v1/clients?client_id=acme", "{}")
	clientKey, _ := decode(t, raw)["key"].(map[string]any)["secret"].(string)
	_, raw = as(clientKey, "POST", "/v1/clients/acme/agents?agent_id=bot", "{}")
	agent := decode(t, raw)
	agentKey, _ := agent["initialKey"].(map[string]any)["secret"].(string)
	keyName, _ := agent["initialKey"].(map[string]any)["name"].(string)
	if clientKey == "" || agentKey == "" {
		t.Fatalf("no keys created: %s", raw)
	}
	secrets := []string{parleytest.OperatorToken(t), clientKey, agentKey}
	if code, _ := as(agentKey, "GET", "/v1/clients/acme/agents/bot", ""); code != http.StatusOK {
		t.Errorf("GET own agent with its key = %d, want 200", code)
	}
	if code, _ := as(agentKey, "GET", "/v1/clients/other/agents/x", ""); code != http.StatusForbidden {
		t.Errorf("GET another client's agent = %d, want 403", code)
	}
	if code, _ := as(clientKey, "DELETE", "/v1/"+keyName, ""); code != http.StatusOK {
		t.Errorf("DELETE %s = %d, want 200", keyName, code)
	}
	if code, _ := as(agentKey, "GET", "/v1/clients/acme/agents/bot", ""); code != http.StatusUnauthorized {
		t.Errorf("GET with the revoked key = %d, want 401", code)
	}
	if code, _ := as(agentKey[:len(agentKey)-1]+"x", "GET", "/v1/clients/acme/agents/bot", ""); code != http.StatusUnauthorized {
		t.Errorf("GET with a forged key = %d, want 401", code)
	}
	logs := srv.Log.String()
	if !strings.Contains(logs, "call refused") {
		t.Fatalf("the server logged no refusal; is the log captured?\n%s", logs)
	}
	for _, s := range secrets {
		if strings.Contains(logs, s) || strings.Contains(logs, s[len(s)-43:]) {
			t.Errorf("the server's log holds a secret (%s…)", s[:12])
		}
	}
}

// TestSecrets_logCheckFindsPlantedSecrets: the check TestMain runs over
// every server's log finds an agent key, a client key, the operator token
// and a TLS private key wherever they sit in a JSON log line, and its
// report does not repeat them. Key names (which are not secrets) pass.
func TestSecrets_logCheckFindsPlantedSecrets(t *testing.T) {
	agentKey, _, _, err := auth.NewKey(auth.Agent)
	if err != nil {
		t.Fatal(err)
	}
	clientKey, _, _, err := auth.NewKey(auth.Client)
	if err != nil {
		t.Fatal(err)
	}
	op, err := auth.NewOperatorToken()
	if err != nil {
		t.Fatal(err)
	}
	leaf := tlstest.NewCA(t, "planted").Issue(t, "svc")
	pemKey, err := os.ReadFile(leaf.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Split(string(pemKey), "\n")[1]
	jsonKey, _ := json.Marshal(string(pemKey))
	lines := []string{
		`{"level":"INFO","msg":"grpc call","method":"/parley.registry.v1.RegistryService/GetAgent","principal":"clients/acme/agents/bot","key":"clients/acme/agents/bot/keys/0123456789abcdef"}`,
		`{"level":"WARN","msg":"call refused","err":"bad key ` + agentKey + `"}`,
		`{"level":"DEBUG","msg":"header","authorization":"Bearer ` + clientKey + `"}`,
		`{"level":"ERROR","msg":"token","value":"` + op + `"}`,
		`{"level":"ERROR","msg":"tls","key":` + string(jsonKey) + `}`,
		`{"level":"ERROR","msg":"tls","der":"xx` + body + `xx"}`,
	}
	found := parleytest.SecretsIn(strings.Join(lines, "\n"), body)
	if len(found) != 5 {
		t.Fatalf("SecretsIn found %d leaks, want 5 (every line but the first):\n%s", len(found), strings.Join(found, "\n"))
	}
	for i, f := range found {
		if want := fmt.Sprintf("line %d ", i+2); !strings.HasPrefix(f, want) {
			t.Errorf("leak %d = %q, want it on %s", i, f, want)
		}
		for _, s := range []string{agentKey, clientKey, op, body} {
			if strings.Contains(f, s) {
				t.Errorf("the report of leak %d repeats the secret", i)
			}
		}
	}
}
