package app_test

import (
	"bufio"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// rawSSE opens agent's SSE stream over a plain TCP connection, as curl
// does, and returns the connection, its reader positioned after the
// ": connected" comment, and the response head.
func rawSSE(t *testing.T, base, agent string) (net.Conn, *bufio.Reader, string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "GET /v1/%s/messages:stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n", agent); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var head strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the response head: %v (so far %q)", err, head.String())
		}
		head.WriteString(line)
		if line == "\r\n" {
			break
		}
	}
	// (A chunked body, which this server does not send, would have a
	// chunk size line first.)
	for i := 0; ; i++ {
		line, err := r.ReadString('\n')
		if err != nil || i == 2 {
			t.Fatalf("stream = %q, %v; want \": connected\" first\n%s", line, err, head.String())
		}
		if line == ": connected\n" {
			break
		}
	}
	return c, r, head.String()
}

// An idle HTTP/1.1 SSE stream holds one goroutine on the server, not
// net/http's two (the connection's and the one that watches for the
// client leaving), and no chunked encoding: the server writes the stream
// itself on the connection until it ends.
func TestStreamSSE_idleStreamHoldsOneGoroutine(t *testing.T) {
	e := startDispatcherApp(t)
	_, _, head := rawSSE(t, e.base, echo)
	for _, want := range []string{"HTTP/1.1 200 OK\r\n", "Content-Type: text/event-stream\r\n", "Cache-Control: no-store\r\n", "Connection: close\r\n"} {
		if !strings.Contains(head, want) {
			t.Errorf("response head lacks %q:\n%s", want, head)
		}
	}
	if strings.Contains(strings.ToLower(head), "transfer-encoding") {
		t.Errorf("response head is chunked:\n%s", head)
	}

	const n = 50
	readers := make([]*bufio.Reader, n)
	for i := range n {
		_, readers[i], _ = rawSSE(t, e.base, fmt.Sprintf("clients/acme/agents/idle%d", i))
	}
	// The handlers return once their stream is established; wait for them.
	deadline := time.Now().Add(10 * time.Second) // bounds a broken run only
	for streamGoroutines() > n+1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := streamGoroutines(); got > n+1 {
		t.Errorf("%d idle SSE streams hold %d goroutines, want at most one each", n+1, got)
	}

	// The streams still deliver.
	send(t, e.app, "m1", "clients/acme/agents/idle7")
	for {
		line, err := readers[7].ReadString('\n')
		if err != nil {
			t.Fatalf("reading stream 7: %v", err)
		}
		if strings.HasPrefix(line, "data: ") {
			if !strings.Contains(line, `"messageId":"m1"`) {
				t.Errorf("stream 7 got %s, want m1", line)
			}
			break
		}
	}
}

// A client that hangs up is noticed when a write to it fails (here, a
// keepalive every 20 ms), and its stream's goroutine ends.
func TestStreamSSE_clientThatHungUpIsNoticedByAWrite(t *testing.T) {
	e := startDispatcherApp(t, "--mailbox-stream-keepalive", "20ms")
	const n = 20
	conns := make([]net.Conn, n)
	for i := range n {
		conns[i], _, _ = rawSSE(t, e.base, fmt.Sprintf("clients/acme/agents/gone%d", i))
	}
	for _, c := range conns {
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second) // bounds a broken run only
	for streamGoroutines() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := streamGoroutines(); got > 0 {
		t.Errorf("%d goroutines of SSE streams or HTTP connections remain after %d clients hung up, want none", got, n)
	}
}

// streamGoroutines counts the goroutines serving SSE streams or HTTP
// connections (net/http's, and the one watching for a client leaving).
func streamGoroutines() int {
	buf := make([]byte, 8<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "sseHandler") || strings.Contains(g, "net/http.(*conn") {
			n++
		}
	}
	return n
}
