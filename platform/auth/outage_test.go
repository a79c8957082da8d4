package auth

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestVerifierOutage_loggedOncePerInterval: while keys cannot be checked
// every keyed call is refused as UNAVAILABLE, but the warning is written
// once per interval (with how many were left out), not once per call.
func TestVerifierOutage_loggedOncePerInterval(t *testing.T) {
	var logs bytes.Buffer
	now := time.Unix(1_000_000, 0)
	down := VerifierFunc(func(context.Context, string) (Principal, error) {
		return Principal{}, errors.New("registry unreachable")
	})
	a := New(Options{
		Verifier: down,
		Policy:   Policy{"/t.S/M": {Allow: AnyKey}},
		Logger:   slog.New(slog.NewJSONHandler(&logs, nil)),
		Now:      func() time.Time { return now },
	})
	key, _, _, _ := NewKey(Agent)
	try := func() {
		t.Helper()
		_, err := a.check(t.Context(), call{method: "/t.S/M", header: "Bearer " + key, remote: "192.0.2.1"})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("check during an outage = %v, want UNAVAILABLE", err)
		}
	}
	for range 50 {
		try()
	}
	if n := strings.Count(logs.String(), "key verification failed"); n != 1 {
		t.Fatalf("50 calls in one interval wrote %d outage warnings, want 1:\n%s", n, logs.String())
	}
	now = now.Add(outageLogInterval)
	try()
	if n := strings.Count(logs.String(), "key verification failed"); n != 2 || !strings.Contains(logs.String(), `"suppressed":49`) {
		t.Errorf("after the interval: %d warnings, want 2, the second counting 49 suppressed:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), key) {
		t.Errorf("the log holds the key")
	}
}
