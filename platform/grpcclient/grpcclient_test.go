package grpcclient

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// freeAddr returns a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// waitForState waits until conn reports want.
func waitForState(t *testing.T, conn *grpc.ClientConn, want connectivity.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != want; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("connection stayed %v, want %v", s, want)
		}
	}
}

// serveHealth serves the health service on addr until the test ends.
func serveHealth(t *testing.T, addr string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
}

// A peer that was down when the connection last tried it (so the connection
// is in reconnect backoff) answers a call made as soon as it is up: the call
// waits for the connection to be ready instead of failing at once.
func TestDial_callWaitsForAPeerThatComesUp(t *testing.T) {
	addr := freeAddr(t)
	conn, err := Dial(addr, Options{ReadyTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitForState(t, conn, connectivity.TransientFailure)
	serveHealth(t, addr)
	resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check = %v, %v; want SERVING once the peer is up", resp, err)
	}
}

// ReadyTimeout bounds the wait: a peer that stays down fails the call with
// UNAVAILABLE (not the caller's deadline) when it runs out.
func TestDial_callTimeoutBoundsTheWait(t *testing.T) {
	conn, err := Dial(freeAddr(t), Options{ReadyTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Check with the peer down = %v, want UNAVAILABLE", err)
	}
	t.Log(err)
}

// deadlineHealth answers Check, reporting whether the call carried a
// deadline.
type deadlineHealth struct {
	healthpb.UnimplementedHealthServer
	hadDeadline chan bool
}

func (h deadlineHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	_, ok := ctx.Deadline()
	h.hadDeadline <- ok
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// ReadyTimeout bounds only the wait for a connection: the call itself runs
// under the caller's deadline (none here), so a long poll is not cut short.
func TestDial_readyTimeoutDoesNotBoundTheCall(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := deadlineHealth{hadDeadline: make(chan bool, 1)}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, h)
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	conn, err := Dial(l.Addr().String(), Options{ReadyTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if <-h.hadDeadline {
		t.Error("the call reached the peer with a deadline; want only the caller's (none)")
	}
}
