package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

// TestConnect_stuckAgentDoesNotBlockRequests: an SDK agent that stops
// reading its stream makes requests routed to it fail within the handler
// timeout (never hang), and is dropped once its queue stays full.
func TestConnect_stuckAgentDoesNotBlockRequests(t *testing.T) {
	const handlerTimeout = 200 * time.Millisecond
	e := startWeather(t, 0, Options{HandlerTimeout: handlerTimeout, HandlerQueue: 2})
	// A fixed 64 KiB receive window (no BDP growth), so the server's sends
	// block as soon as the client stops reading.
	conn, err := grpc.NewClient(e.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(65535))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := dispatcherv1.NewDispatcherServiceClient(conn).Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_Hello{Hello: &dispatcherv1.AgentHello{Agent: weatherAgent, NaturalLanguage: true}}}); err != nil {
		t.Fatal(err)
	}
	if first, err := stream.Recv(); err != nil || first.GetReady() == nil {
		t.Fatalf("Connect: first message = %v, %v; want ready", first, err)
	}
	// From here on the agent reads nothing.

	big := `{"body":"` + strings.Repeat("x", 200<<10) + `"}`
	post := func() (int, string) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*handlerTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/agora/acme/weather", strings.NewReader(big))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("a request to the stuck agent did not finish within %v: %v", 10*handlerTimeout, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.srv.hub.NL(weatherAgent) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the stuck agent was never dropped")
		}
		if code, raw := post(); code != 200 || !strings.Contains(raw, `"failure"`) {
			t.Fatalf("request to the stuck agent = %d %.200s, want a failure", code, raw)
		}
	}
	// Dropped: requests no longer go to it (no LLM here, so a clear failure).
	if code, raw := post(); code != 200 || !strings.Contains(raw, "no connected handler") {
		t.Errorf("after the drop = %d %.200s, want the no-handler failure", code, raw)
	}
	if _, err := stream.Recv(); err == nil {
		// Draining what was sent is fine; the stream must end eventually.
		for err == nil {
			_, err = stream.Recv()
		}
	}
}
