package app_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

// Until the built-in service protocols are stored in the registry (the fake
// registry here never stores them), NewRequest under one of them is
// UNAVAILABLE, which a caller retries, not INVALID_ARGUMENT.
func TestApp_newRequestBeforeTheBuiltinProtocolsAreRegisteredIsUnavailable(t *testing.T) {
	client, _ := startDispatcher(t)
	_, err := client.NewRequest(t.Context(), &dispatcherv1.NewRequestRequest{
		Sender: "clients/acme/agents/echo", To: &dispatcherv1.DistributionList{Direct: []string{"clients/acme/agents/other"}},
		Protocol: "allocate", TaskJson: `{"what":"deliver"}`,
	})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("NewRequest(allocate) before registration: error = %v, want UNAVAILABLE saying it is not registered yet", err)
	}
}
