package parleytest

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// Every server's log and every secret noted, kept for the whole test
// binary so that TestMain can check, after all tests, that no secret
// reached any log line (CheckLogsForSecrets).
var run struct {
	mu      sync.Mutex
	logs    []keptLog
	secrets []string
}

// keptLog is one server's log and who ran it.
type keptLog struct {
	who string // the test and the binary
	log *SyncBuffer
}

func keepLog(who string, b *SyncBuffer) {
	run.mu.Lock()
	defer run.mu.Unlock()
	run.logs = append(run.logs, keptLog{who, b})
}

// NoteSecret adds secret to what CheckLogsForSecrets looks for. Parley's
// credentials (client and agent keys, operator tokens) are found by their
// prefixes without being noted; note other secrets, such as TLS private
// keys (NoteKeyFile).
func NoteSecret(secret string) {
	run.mu.Lock()
	defer run.mu.Unlock()
	run.secrets = append(run.secrets, secret)
}

// NoteKeyFile notes each line of the base64 body of the PEM file at path
// (a TLS private key): a key that reached a log in any form that keeps its
// PEM lines is found.
func NoteKeyFile(t testing.TB, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if len(l) >= 32 && !strings.HasPrefix(l, "-----") {
			NoteSecret(l)
		}
	}
}

// credential matches a Parley client key, agent key or operator token.
var credential = regexp.MustCompile(`parley_(?:ak|ck|op)_[0-9A-Za-z_-]{16,}`)

// SecretsIn returns a description of each line of log that holds a Parley
// credential, a PEM private key, or one of secrets. The descriptions name
// the line and what it holds, with the secret itself cut out, so that
// reporting a leak does not repeat it.
func SecretsIn(log string, secrets ...string) []string {
	var found []string
	for i, line := range strings.Split(log, "\n") {
		var what []string
		if credential.MatchString(line) {
			what = append(what, "a Parley credential")
		}
		if strings.Contains(line, "PRIVATE KEY") {
			what = append(what, "a PEM private key")
		}
		for _, s := range secrets {
			if s != "" && strings.Contains(line, s) {
				what = append(what, "a noted secret")
				line = strings.ReplaceAll(line, s, "[secret]")
			}
		}
		if len(what) > 0 {
			line = credential.ReplaceAllString(line, "[credential]")
			if len(line) > 300 {
				line = line[:300] + "…"
			}
			found = append(found, fmt.Sprintf("line %d holds %s: %s", i+1, strings.Join(what, " and "), line))
		}
	}
	return found
}

// CheckLogsForSecrets looks through every line every server started by
// this package logged during the test binary's run, at whatever level it
// ran, for Parley credentials (every key a test created, and the operator
// token), PEM private keys and the secrets noted with NoteSecret. Call it
// from TestMain after m.Run.
func CheckLogsForSecrets() error {
	run.mu.Lock()
	logs, secrets := run.logs, run.secrets
	run.mu.Unlock()
	if operator.token != "" {
		secrets = append(secrets, operator.token)
	}
	var found []string
	lines := 0
	for _, l := range logs {
		text := l.log.String()
		lines += strings.Count(text, "\n") + 1
		for _, f := range SecretsIn(text, secrets...) {
			found = append(found, l.who+": "+f)
		}
	}
	if len(found) > 0 {
		if len(found) > 20 {
			found = append(found[:20], fmt.Sprintf("and %d more", len(found)-20))
		}
		return fmt.Errorf("secrets in the servers' logs (%d servers, %d lines):\n%s", len(logs), lines, strings.Join(found, "\n"))
	}
	return nil
}
