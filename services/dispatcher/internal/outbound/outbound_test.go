package outbound_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/egress"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
	"github.com/parleyhq/parley/services/dispatcher/internal/outbound"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine/routinetest"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

const agent = "clients/acme/agents/asker"

type fakeRegistry struct{}

func (fakeRegistry) GetAgent(_ context.Context, name string) (directory.Agent, error) {
	if name != agent {
		return directory.Agent{}, directory.ErrNotFound
	}
	return directory.Agent{Name: agent}, nil
}

func (fakeRegistry) ResolveProtocol(context.Context, string, []string) (directory.Document, error) {
	return directory.Document{}, directory.ErrNotFound
}
func (fakeRegistry) CreateProtocol(context.Context, []byte) error               { return nil }
func (fakeRegistry) AddSupportedProtocol(context.Context, string, string) error { return nil }

// fakeClient answers every request with do: the seam for the network.
type fakeClient func(*http.Request) (*http.Response, error)

func (f fakeClient) Do(r *http.Request) (*http.Response, error) { return f(r) }

type agents struct{}

func (agents) Exists(context.Context, string) error { return nil }

func newSender(t *testing.T, c outbound.Client) *outbound.Sender {
	t.Helper()
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m := metrics.New(nil)
	dir := directory.New(fakeRegistry{}, directory.Options{CacheTTL: time.Minute, Now: time.Now})
	routines := hosted.New(st, agents{}, hosted.Options{QuarantineAfter: 3, Metrics: m, Limits: routinetest.Limits(routine.Limits{Pool: routine.InProcessForTests()})})
	return outbound.New(c, dir, routines, nil, llm.Counted{LLM: llm.NoLLM{}, Metrics: m}, st, nil, outbound.Options{Timeout: 10 * time.Second, MaxListed: 5, Metrics: m})
}

func reply(status int, body string) (*http.Response, error) {
	return &http.Response{StatusCode: status, Body: io.NopCloser(strings.NewReader(body)), Header: http.Header{}}, nil
}

func TestSend_text(t *testing.T) {
	var got string
	s := newSender(t, fakeClient(func(r *http.Request) (*http.Response, error) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		return reply(200, `{"status":"success","body":"hello back"}`)
	}))
	res, err := s.Send(t.Context(), outbound.Request{Agent: agent, TargetURL: "https://peer.example/agent", Text: "hello"})
	if err != nil || res.Status != "success" || string(res.Body) != `"hello back"` || res.Path != "text" {
		t.Fatalf("Send(text) = %+v, %v; want success via text", res, err)
	}
	if !strings.Contains(got, `"body":"hello"`) {
		t.Errorf("posted %s, want the text as the body", got)
	}
	if _, err := s.Send(t.Context(), outbound.Request{Agent: "clients/acme/agents/ghost", TargetURL: "https://peer.example", Text: "x"}); !errors.Is(err, outbound.ErrUnknownAgent) {
		t.Errorf("Send(unknown agent) = %v, want ErrUnknownAgent", err)
	}
}

// TestSend_targetErrorsNameNothingOfOurs: what the network said stays in
// the log; the caller learns refused, unreachable, slow or not Agora.
func TestSend_targetErrorsNameNothingOfOurs(t *testing.T) {
	dnsErr := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "0x7f000001", Server: "10.255.255.53:53"}}
	for _, tt := range []struct {
		name string
		do   func(*http.Request) (*http.Response, error)
		kind error
		want string
	}{
		{"refused", func(*http.Request) (*http.Response, error) {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: &egress.RefusedError{Addr: "10.1.2.3", Reason: "private"}}
		}, outbound.ErrTargetRefused, "target https://peer.example refused: internal address"},
		{"resolver", func(*http.Request) (*http.Response, error) { return nil, dnsErr }, outbound.ErrTargetUnavailable, "target https://peer.example could not be reached"},
		{"timeout", func(*http.Request) (*http.Response, error) {
			return nil, &net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}
		}, outbound.ErrTargetUnavailable, "target https://peer.example did not answer in time"},
		{"not Agora", func(*http.Request) (*http.Response, error) { return reply(502, "<html>bad gateway</html>") },
			outbound.ErrTargetUnavailable, "target https://peer.example answered HTTP 502 with a reply that is not JSON"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newSender(t, fakeClient(tt.do))
			_, err := s.Send(t.Context(), outbound.Request{Agent: agent, TargetURL: "https://peer.example", Text: "x"})
			if !errors.Is(err, tt.kind) || err.Error() != tt.want {
				t.Errorf("Send = %v, want %q (%v)", err, tt.want, tt.kind)
			}
		})
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
