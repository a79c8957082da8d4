package server

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

// oneMessageSource is a mailbox with one message: a stream gets the
// first, empty batch, the message, and then ends as taken over.
type oneMessageSource struct{}

func (oneMessageSource) acknowledge(context.Context, string, uint64) error { return nil }

func (oneMessageSource) receive(_ context.Context, agent string, _ uint64, _ bool, send func([]*dispatcherv1.NetworkMessage) error) error {
	if err := send(nil); err != nil {
		return err
	}
	if err := send([]*dispatcherv1.NetworkMessage{{MessageId: "m1", Recipient: agent, Cursor: 1, BodyJson: []byte(`{}`)}}); err != nil {
		return err
	}
	return status.Error(codes.Aborted, "a newer stream took over")
}

// The SSE handler writes the same stream on its three paths: an HTTP/1.1
// connection it hijacks (plain, and a *tls.Conn over TLS), HTTP/2 through
// net/http, and a ResponseWriter that cannot be hijacked, through which
// the handler writes for the stream.
func TestSSEHandler_pathsWriteTheSameStream(t *testing.T) {
	h := sseHandler{src: oneMessageSource{}, writeTimeout: 10 * time.Second, streams: &streamSet{}}
	mux := http.NewServeMux()
	mux.Handle(StreamPattern, h)
	const path = "/v1/clients/acme/agents/bob/messages:stream"
	check := func(t *testing.T, proto, contentType, body string) {
		t.Helper()
		if contentType != "text/event-stream" {
			t.Errorf("%s: Content-Type %q, want text/event-stream", proto, contentType)
		}
		for _, want := range []string{": connected\n\n", "id: 1\nevent: message\ndata: {\"messageId\":\"m1\"", "event: end\ndata: {\"code\":\"Aborted\""} {
			if !strings.Contains(body, want) {
				t.Errorf("%s body lacks %q:\n%s", proto, want, body)
			}
		}
	}
	t.Run("HTTP/1.1, hijacked", func(t *testing.T) {
		srv := httptest.NewServer(mux)
		defer srv.Close()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ProtoMajor != 1 || !resp.Close || len(resp.TransferEncoding) != 0 {
			t.Errorf("response %s, close %v, transfer encoding %v; want HTTP/1.1 closed, unchunked", resp.Proto, resp.Close, resp.TransferEncoding)
		}
		check(t, "HTTP/1.1", resp.Header.Get("Content-Type"), string(body))
	})
	t.Run("HTTP/1.1 over TLS, hijacked", func(t *testing.T) {
		srv := httptest.NewTLSServer(mux) // no HTTP/2: ALPN settles on HTTP/1.1
		defer srv.Close()
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ProtoMajor != 1 || resp.TLS == nil || !resp.Close || len(resp.TransferEncoding) != 0 {
			t.Errorf("response %s, TLS %v, close %v, transfer encoding %v; want HTTP/1.1 over TLS, closed, unchunked", resp.Proto, resp.TLS != nil, resp.Close, resp.TransferEncoding)
		}
		check(t, "HTTP/1.1 over TLS", resp.Header.Get("Content-Type"), string(body))
	})
	t.Run("HTTP/2", func(t *testing.T) {
		srv := httptest.NewUnstartedServer(mux)
		srv.EnableHTTP2 = true
		srv.StartTLS()
		defer srv.Close()
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ProtoMajor != 2 {
			t.Errorf("response %s, want HTTP/2", resp.Proto)
		}
		check(t, "HTTP/2", resp.Header.Get("Content-Type"), string(body))
	})
	t.Run("no hijack", func(t *testing.T) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		check(t, "recorder", rec.Header().Get("Content-Type"), rec.Body.String())
	})
}

// countingSource counts the streams opened on it.
type countingSource struct {
	oneMessageSource
	opened atomic.Int64
}

func (c *countingSource) receive(ctx context.Context, agent string, after uint64, clear bool, send func([]*dispatcherv1.NetworkMessage) error) error {
	c.opened.Add(1)
	return c.oneMessageSource.receive(ctx, agent, after, clear, send)
}

// The GET route also answers HEAD (net/http's mux): with the stream's
// headers and no body, and without opening a stream, which would take
// over the agent's live one.
func TestSSEHandler_headOpensNoStream(t *testing.T) {
	src := &countingSource{}
	mux := http.NewServeMux()
	mux.Handle(StreamPattern, sseHandler{src: src, writeTimeout: 10 * time.Second, streams: &streamSet{}})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Head(srv.URL + "/v1/clients/acme/agents/bob/messages:stream")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("HEAD = %d, Content-Type %q; want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if n := src.opened.Load(); n != 0 {
		t.Errorf("HEAD opened %d streams, want none", n)
	}
}

// slowEndSource sends one empty batch, then, once its stream is cancelled,
// takes a while to end, as a stream that a gateway reads from a dispatcher
// over gRPC does.
type slowEndSource struct{ endAfter time.Duration }

func (slowEndSource) acknowledge(context.Context, string, uint64) error { return nil }

func (s slowEndSource) receive(ctx context.Context, _ string, _ uint64, _ bool, send func([]*dispatcherv1.NetworkMessage) error) error {
	if err := send(nil); err != nil {
		return err
	}
	<-ctx.Done()
	time.Sleep(s.endAfter)
	return status.Error(codes.Unavailable, "the gateway is shutting down; reconnect")
}

// A gateway's streams on hijacked connections are not waited for by
// net/http's shutdown: the streams' stop waits for each to write its end
// event, so that a process exiting after it loses none.
func TestStreamSet_stopWaitsForTheEndEvent(t *testing.T) {
	streams := &streamSet{}
	h := sseHandler{src: slowEndSource{endAfter: 300 * time.Millisecond}, writeTimeout: 10 * time.Second, streams: streams}
	mux := http.NewServeMux()
	mux.Handle(StreamPattern, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /v1/clients/acme/agents/bob/messages:stream HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	var got strings.Builder
	for !strings.Contains(got.String(), ": connected\n\n") {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream's start: %v (read %q)", err, got.String())
		}
		got.WriteString(line)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	streams.stopWithin(ctx)
	// The end event is in the connection's buffer already: a read finds
	// it at once, long before the source's delay would have passed.
	_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	rest, _ := io.ReadAll(r)
	if !strings.Contains(string(rest), "event: end\ndata: {\"code\":\"Unavailable\"") {
		t.Errorf("after stopWithin returned, the stream's remaining bytes are %q, want its end event", rest)
	}
}
