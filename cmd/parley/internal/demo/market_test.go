package demo

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/sdk"
)

// A slow supplier that never tries its late answer ends the wait with an
// error naming what did not happen, not a hang: the context here has no
// deadline, as the CLI's had when the demo hung in CI.
func TestWaitLate_reportsAMissingLateAttempt(t *testing.T) {
	mk := &market{
		lateTried: map[string]chan struct{}{sdk.Allocate: make(chan struct{})},
		lateWait:  1, // the bound, not a timing: it has passed once the wait starts
		lateErr:   map[string]error{},
	}
	err := mk.waitLate(t.Context(), sdk.Allocate)
	if err == nil || !strings.Contains(err.Error(), "slow did not try its late offer") {
		t.Fatalf("waitLate() error = %v, want one naming slow's missing late offer", err)
	}
}

// A late attempt that failed (the network took it, or another error) is
// reported by the wait, instead of leaving it open.
func TestWaitLate_reportsAFailedLateAttempt(t *testing.T) {
	mk := &market{
		lateTried: map[string]chan struct{}{sdk.Transact: make(chan struct{})},
		lateWait:  time.Hour,
		lateErr:   map[string]error{},
	}
	mk.lateDone(sdk.Transact, errors.New("the network took slow's late offer, want a refusal"))
	err := mk.waitLate(t.Context(), sdk.Transact)
	if err == nil || !strings.Contains(err.Error(), "the network took slow's late offer") {
		t.Fatalf("waitLate() error = %v, want the late attempt's error", err)
	}
}

// When slow's late attempt never comes, the wait's error carries what the
// agents' loops reported meanwhile (a handler's error or panic, a message
// no route took), which the SDK otherwise only hands to OnError.
func TestWaitLate_namesWhatTheAgentsReported(t *testing.T) {
	mk := &market{
		lateTried: map[string]chan struct{}{sdk.Allocate: make(chan struct{})},
		lateWait:  1, // the bound, not a timing: it has passed once the wait starts
		lateErr:   map[string]error{},
	}
	mk.agentError("slow", errors.New("route \"service\", message 42: handler panicked: boom"))
	err := mk.waitLate(t.Context(), sdk.Allocate)
	if err == nil || !strings.Contains(err.Error(), "slow did not try its late offer") || !strings.Contains(err.Error(), "slow: route \"service\", message 42: handler panicked: boom") {
		t.Fatalf("waitLate() error = %v, want one naming slow's missing late offer and what slow's loop reported", err)
	}
}
