package sdk_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/sdk"
)

// failingPayments answers every CreatePayment with code and records the
// request_ids it was sent.
type failingPayments struct {
	dispatcherv1.UnimplementedDispatcherServiceServer
	code codes.Code
	mu   sync.Mutex // guards ids
	ids  []string
}

func (f *failingPayments) CreatePayment(_ context.Context, req *dispatcherv1.CreatePaymentRequest) (*dispatcherv1.Payment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ids = append(f.ids, req.GetRequestId())
	return nil, status.Error(f.code, "no")
}

// CreatePayment retries only UNAVAILABLE, a bounded number of times with
// one request_id, and returns the last error; any other code is final.
// (The retry returning the first payment is tested against the real
// server in cmd/parley.)
func TestCreatePayment_retriesOnlyUnavailableAndGivesUp(t *testing.T) {
	for _, tc := range []struct {
		code  codes.Code
		calls int
	}{
		{codes.Unavailable, 4},
		{codes.ResourceExhausted, 1},
		{codes.InvalidArgument, 1},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			f := &failingPayments{code: tc.code}
			conn := serveDispatcher(t, f)
			na, err := sdk.NewNetworkAgent(conn, "clients/c/agents/buyer", sdk.NetworkOptions{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			sa, err := sdk.NewServiceAgent(conn, na, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = sa.CreatePayment(t.Context(), "clients/c/agents/shop", sdk.Price{AmountMicros: 1, Currency: "USD"})
			if status.Code(err) != tc.code {
				t.Errorf("CreatePayment = %v, want %v", err, tc.code)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.ids) != tc.calls {
				t.Fatalf("CreatePayment made %d calls, want %d", len(f.ids), tc.calls)
			}
			for _, id := range f.ids {
				if id == "" || id != f.ids[0] {
					t.Errorf("request_ids sent = %q, want one non-empty id", f.ids)
					break
				}
			}
		})
	}
}
