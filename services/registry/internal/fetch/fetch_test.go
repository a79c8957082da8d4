package fetch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func newFetcher(t *testing.T, opts Options) *Fetcher {
	t.Helper()
	f, err := New(testOptions(opts))
	if err != nil {
		t.Fatalf("New(%+v) error = %v", opts, err)
	}
	return f
}

// testOptions returns o with every limit it leaves zero set to a test
// value: New substitutes no defaults (the registry's config owns them).
func testOptions(o Options) Options {
	if o.MaxBytes == 0 {
		o.MaxBytes = 256 << 10
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = 2 * time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if o.MaxConcurrent == 0 {
		o.MaxConcurrent = 64
	}
	if o.MaxPerHost == 0 {
		o.MaxPerHost = 4
	}
	return o
}

// listen binds a loopback listener that must never see a connection.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// assertNoConnection fails if a TCP connection reached ln. A completed
// handshake would sit in the accept queue, so an Accept with a deadline in
// the past returns it at once; otherwise it times out at once.
func assertNoConnection(t *testing.T, ln net.Listener) {
	t.Helper()
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	c, err := ln.Accept()
	if err == nil {
		c.Close()
		t.Errorf("listener %s accepted a connection; want none", ln.Addr())
	}
}

func TestDecodeData(t *testing.T) {
	tests := []struct {
		name, source, want string
	}{
		{"base64", DataBase64Prefix + "aGVsbG8=", "hello"},
		{"percent, python quote of non-ASCII", DataPercentPrefix + "a%20b%2Bc/d%0A%C2%B0", "a b+c/d\n°"},
		{"percent keeps a raw plus", DataPercentPrefix + "a+b", "a+b"},
		{"percent empty", DataPercentPrefix, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := newFetcher(t, Options{}).Fetch(t.Context(), tt.source)
			if err != nil || string(got) != tt.want {
				t.Errorf("Fetch(%q) = %q, %v; want %q", tt.source, got, err, tt.want)
			}
		})
	}
}

func TestFetch_rejectsBadSources(t *testing.T) {
	tests := []struct {
		name, source string
		want         error
	}{
		{"other data prefix", "data:text/plain;base64,aGVsbG8=", ErrMalformed},
		{"uppercase charset", "data:text/plain;charset=UTF-8,hi", ErrMalformed},
		{"bare data", "data:,hi", ErrMalformed},
		{"bad base64", DataBase64Prefix + "!!!", ErrMalformed},
		{"bad escape", DataPercentPrefix + "%zz", ErrMalformed},
		{"data too large", DataPercentPrefix + strings.Repeat("x", 11), ErrTooLarge},
		{"ftp", "ftp://example.com/pd", ErrMalformed},
		{"relative", "/protocols/abc", ErrMalformed},
		{"no host", "https:///pd", ErrMalformed},
		{"http not allowed", "http://example.com/pd", ErrRefused},
		{"credentials", "https://user:pw@example.com/pd", ErrRefused},
	}
	f := newFetcher(t, Options{MaxBytes: 10})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if b, err := f.Fetch(t.Context(), tt.source); !errors.Is(err, tt.want) {
				t.Errorf("Fetch(%q) = %q, %v; want %v", tt.source, b, err, tt.want)
			}
		})
	}
}

func TestFetch_refusesInternalDestinations(t *testing.T) {
	ln := listen(t)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	tests := []struct {
		name, url string
	}{
		{"loopback", "http://" + ln.Addr().String() + "/pd"},
		{"localhost resolves to loopback", "http://localhost:" + port + "/pd"},
		{"cloud metadata", "http://169.254.169.254/latest/meta-data/"},
		{"private", "http://10.0.0.1/pd"},
		{"IPv6 loopback", "http://[::1]:" + port + "/pd"},
		{"IPv4-mapped loopback", "http://[::ffff:127.0.0.1]:" + port + "/pd"},
		{"CGNAT", "http://100.64.0.1/pd"},
		{"unspecified", "http://0.0.0.0:" + port + "/pd"},
		{"https private", "https://192.168.1.1/pd"},
		{"IPv4-compatible loopback", "https://[::127.0.0.1]:" + port + "/pd"},
		{"IPv4-translated loopback", "https://[::ffff:0:127.0.0.1]:" + port + "/pd"},
		{"site-local", "https://[fec0::1]/pd"},
		{"reserved IPv6", "https://[4000::1]/pd"},
	}
	f := newFetcher(t, Options{AllowHTTP: true, Allow: []string{"8.8.8.8/32"}})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.Fetch(t.Context(), tt.url)
			var refused *RefusedError
			if !errors.As(err, &refused) || !errors.Is(err, ErrRefused) {
				t.Fatalf("Fetch(%s) error = %v; want a RefusedError from the dialer", tt.url, err)
			}
		})
	}
	assertNoConnection(t, ln)
}

func TestFetch_refusesRedirectIntoInternalDestinations(t *testing.T) {
	victim := listen(t)
	var target atomic.Value
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.Load().(string), http.StatusFound)
	}))
	t.Cleanup(redirector.Close)
	// Only the redirector's exact host:port is trusted, not the victim on
	// the same loopback address.
	f := newFetcher(t, Options{AllowHTTP: true, Allow: []string{redirector.Listener.Addr().String()}, MaxRedirects: 3})
	for _, dest := range []string{
		"http://" + victim.Addr().String() + "/secret",
		"http://169.254.169.254/latest/meta-data/",
		"http://10.0.0.1/admin",
	} {
		target.Store(dest)
		_, err := f.Fetch(t.Context(), redirector.URL+"/pd")
		var refused *RefusedError
		if !errors.As(err, &refused) {
			t.Errorf("Fetch(redirect to %s) error = %v; want a RefusedError", dest, err)
		}
	}
	assertNoConnection(t, victim)
}

func TestFetch_redirectLimits(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		switch r.URL.Path {
		case "/loop":
			http.Redirect(w, r, fmt.Sprintf("/loop?n=%d", n), http.StatusFound)
		case "/ftp":
			http.Redirect(w, r, "ftp://example.com/pd", http.StatusFound)
		case "/three":
			if n <= 3 {
				http.Redirect(w, r, "/three", http.StatusFound)
				return
			}
			fmt.Fprint(w, "arrived")
		}
	}))
	t.Cleanup(srv.Close)
	f := newFetcher(t, Options{AllowHTTP: true, Allow: []string{"127.0.0.0/8"}, MaxRedirects: 3})

	if _, err := f.Fetch(t.Context(), srv.URL+"/loop"); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "redirects") {
		t.Errorf("Fetch(redirect loop) error = %v; want too many redirects", err)
	}
	if got := hits.Load(); got != 4 {
		t.Errorf("redirect loop made %d requests, want 4 (the first and 3 redirects)", got)
	}
	hits.Store(0)
	if b, err := f.Fetch(t.Context(), srv.URL+"/three"); err != nil || string(b) != "arrived" {
		t.Errorf("Fetch(3 redirects) = %q, %v; want arrived", b, err)
	}
	if _, err := f.Fetch(t.Context(), srv.URL+"/ftp"); !errors.Is(err, ErrMalformed) {
		t.Errorf("Fetch(redirect to ftp) error = %v; want ErrMalformed", err)
	}
}

func TestFetch_allowlistedLoopbackIsByteExact(t *testing.T) {
	doc := []byte("---\nname: Météo\n---\r\nTempérature en °C.\n\n  ")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/pd":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write(doc) // a failed write shows as the client's error
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	f := newFetcher(t, Options{AllowHTTP: true, Allow: []string{"127.0.0.1"}})
	got, err := f.Fetch(t.Context(), srv.URL+"/pd")
	if err != nil || !bytes.Equal(got, doc) {
		t.Errorf("Fetch() = %q, %v; want %q", got, err, doc)
	}
	if _, err := f.Fetch(t.Context(), srv.URL+"/missing"); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "404") {
		t.Errorf("Fetch(missing) error = %v; want ErrUnavailable naming 404", err)
	}
}

func TestFetch_sizeCap(t *testing.T) {
	const limit = 256 << 10
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/10mb": // streamed, no Content-Length
			for range (10 << 20) / len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		case "/declared":
			w.Header().Set("Content-Length", fmt.Sprint(10<<20))
			_, _ = w.Write(chunk) // the client hangs up after the declared length
		case "/exact":
			_, _ = w.Write(bytes.Repeat([]byte("y"), limit))
		case "/over":
			_, _ = w.Write(bytes.Repeat([]byte("y"), limit+1)) // the client stops one byte past the cap
		}
	}))
	t.Cleanup(srv.Close)
	f := newFetcher(t, Options{MaxBytes: limit, AllowHTTP: true, Allow: []string{"127.0.0.0/8"}})
	for _, path := range []string{"/10mb", "/declared", "/over"} {
		if b, err := f.Fetch(t.Context(), srv.URL+path); !errors.Is(err, ErrTooLarge) {
			t.Errorf("Fetch(%s) = %d bytes, %v; want ErrTooLarge", path, len(b), err)
		}
	}
	if b, err := f.Fetch(t.Context(), srv.URL+"/exact"); err != nil || len(b) != limit {
		t.Errorf("Fetch(/exact) = %d bytes, %v; want %d", len(b), err, limit)
	}
}

func TestFetch_neverAnsweringSourceEndsWithinBudget(t *testing.T) {
	ln := listen(t)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() }) // hold it open, never answer
		}
	}()
	const budget = 100 * time.Millisecond
	f := newFetcher(t, Options{AllowHTTP: true, Allow: []string{"127.0.0.1/32"}, Timeout: budget, ConnectTimeout: budget})
	// Contract: Timeout ends a fetch. Only the budget can end this one
	// (the source never answers; ctx's deadline is a backstop so that a
	// lost budget fails instead of hanging). The bound is a margin, not a
	// speed: 45 times the budget for a loaded CI machine, yet under the
	// 5s default Timeout that an ignored option would fall back to.
	const bound = 4500 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err := f.Fetch(ctx, "http://"+ln.Addr().String()+"/pd")
	elapsed := time.Since(start)
	if !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
		t.Errorf("Fetch(silent source) error = %v (backstop %v); want ErrUnavailable within the budget", err, ctx.Err())
	}
	if elapsed > bound {
		t.Errorf("Fetch(silent source) took %v; want the %v budget to end it (bound %v)", elapsed, budget, bound)
	}
}

func TestNew_rejectsBadAllowlist(t *testing.T) {
	if _, err := New(Options{Allow: []string{"10.0.0.0/33"}}); err == nil || !strings.Contains(err.Error(), "10.0.0.0/33") {
		t.Errorf("New(bad CIDR) error = %v; want it named", err)
	}
}

func TestFetch_concurrencyLimits(t *testing.T) {
	release := make(chan struct{})
	var inFlight atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		inFlight.Add(1)
		<-release
		fmt.Fprint(w, "doc")
	}))
	t.Cleanup(srv.Close)
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	src := func(host string) string { return fmt.Sprintf("http://%s:%d/pd", host, port) }
	f := newFetcher(t, Options{AllowHTTP: true, Allow: []string{"127.0.0.1", "localhost"}, MaxConcurrent: 2, MaxPerHost: 1, ConnectTimeout: time.Second, Timeout: 10 * time.Second})
	results := make(chan error, 2)
	fetchInBackground := func(source string, want int32) {
		t.Helper()
		go func() {
			_, err := f.Fetch(context.Background(), source)
			results <- err
		}()
		deadline := time.Now().Add(10 * time.Second)
		for inFlight.Load() < want {
			select {
			case err := <-results:
				t.Fatalf("Fetch(%s) ended before reaching the server: %v", source, err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d fetches reached the server, want %d", inFlight.Load(), want)
			}
			runtime.Gosched()
		}
	}

	fetchInBackground(src("127.0.0.1"), 1) // holds 127.0.0.1's only slot
	if _, err := f.Fetch(t.Context(), src("127.0.0.1")); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "from 127.0.0.1") {
		t.Errorf("Fetch(same host, per-host cap full) error = %v; want ErrBusy naming the host", err)
	}
	fetchInBackground(src("localhost"), 2) // another host: the second global slot
	if _, err := f.Fetch(t.Context(), src("127.0.0.3")); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "2 fetches already in flight") {
		t.Errorf("Fetch(third host, global cap full) error = %v; want ErrBusy for the global cap", err)
	}
	if got, err := f.Fetch(t.Context(), DataPercentPrefix+"free"); err != nil || string(got) != "free" {
		t.Errorf("Fetch(data: URI, caps full) = %q, %v; want it decoded without a slot", got, err)
	}
	close(release)
	released = true
	for range 2 {
		if err := <-results; err != nil {
			t.Errorf("Fetch(holding a slot) error = %v", err)
		}
	}
	if got, err := f.Fetch(t.Context(), src("127.0.0.1")); err != nil || string(got) != "doc" {
		t.Errorf("Fetch(after release) = %q, %v; want the document", got, err)
	}
	if n := len(f.limit.hosts); n != 0 {
		t.Errorf("limiter keeps %d idle hosts, want 0", n)
	}
}

// TestFetch_errorsRevealNoInternalAddresses: what a caller reads says that
// the destination was refused or could not be reached, never the address
// a host name resolved to nor the resolver's; the log has the details.
func TestFetch_errorsRevealNoInternalAddresses(t *testing.T) {
	ln := listen(t)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	closed := listen(t)
	closedAddr := closed.Addr().String()
	closed.Close() // connection refused from now on
	var logs bytes.Buffer
	f := newFetcher(t, Options{AllowHTTP: true, Allow: []string{closedAddr}, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	tests := []struct {
		name, url string
		want      error
		msg       string
	}{
		{"name resolving to loopback", "http://localhost:" + port + "/pd", ErrRefused, "destination refused"},
		{"unresolvable name", "http://parley-no-such-host.invalid/pd", ErrUnavailable, "could not be reached or read: source unavailable"},
		{"connection refused", "http://" + closedAddr + "/pd", ErrUnavailable, "could not be reached or read: source unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.Fetch(t.Context(), tt.url)
			if !errors.Is(err, tt.want) || err.Error() != tt.msg {
				t.Fatalf("Fetch(%s) error = %q; want exactly %q", tt.url, err, tt.msg)
			}
		})
	}
	if !strings.Contains(logs.String(), "addr=127.0.0.1") && !strings.Contains(logs.String(), "addr=::1") {
		t.Errorf("log lacks the refused address:\n%s", logs.String())
	}
}

// TestFetch_zeroRedirectsFollowsNone proves MaxRedirects is taken verbatim:
// zero, as --pd-fetch-max-redirects=0 passes it, follows no redirect.
func TestFetch_zeroRedirectsFollowsNone(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			http.Redirect(w, r, "/there", http.StatusFound)
			return
		}
		fmt.Fprint(w, "arrived")
	}))
	t.Cleanup(srv.Close)
	f := newFetcher(t, Options{AllowHTTP: true, Allow: []string{"127.0.0.0/8"}})
	if _, err := f.Fetch(t.Context(), srv.URL+"/pd"); !errors.Is(err, ErrUnavailable) || hits.Load() != 1 {
		t.Errorf("Fetch(one redirect) with MaxRedirects 0 = %v after %d requests, want a redirect error after 1", err, hits.Load())
	}
}
