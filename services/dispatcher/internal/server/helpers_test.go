package server

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine/routinetest"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

// weatherPD is the canonical weather PD of specs/agora.md (464 bytes, no
// final newline).
const weatherPD = "---\nname: Weather Forecast Query Protocol\ndescription: Query the weather forecast for a given date and location.\nmultiround: false\n---\n\nThe sender sends a JSON object {\"date\": \"YYYY-MM-DD\", \"location\": string}.\nThe receiver replies with a JSON object {\"temperature\": number (degrees C), \"precipitation\": number (mm), \"weatherCondition\": one of \"sunny\", \"cloudy\", \"rainy\", \"snowy\"}.\nIf the location is unknown the receiver replies {\"error\": \"Unsupported location\"}."

const weatherHex = "3a732bde0e63d2e838d1a722feebf3d67b52b211"
const weatherB64 = "OnMr3g5j0ug40aci/uvz1ntSshE="

const weatherRoutine = `
def reply(query, memory):
    w = weather(query["location"] + "/" + query["date"])
    if w == None:
        return {"error": "Unsupported location"}
    return w
`

const weatherTable = `{"Paris/2026-12-01": {"temperature": 7, "precipitation": 1.5, "weatherCondition": "rainy"},
 "Rome/2026-12-01": {"temperature": 14, "precipitation": 0, "weatherCondition": "sunny"}}`

func sha1Hex(b []byte) string {
	h := sha1.Sum(b)
	return hex.EncodeToString(h[:])
}

// fakeRegistry is a RegistryService on loopback (services never import each
// other; e2e/ runs the real one). ResolveProtocol verifies data: URI sources
// like the real one. It does not parse metadata: schemas are declared with
// addProtocolSchemas and handed out already as JSON, as the registry does.
type fakeRegistry struct {
	registryv1.UnimplementedRegistryServiceServer

	resolveCalls  atomic.Int64
	getAgentCalls atomic.Int64
	// resolveErr, when set, fails every ResolveProtocol; resolveHook, when
	// set, runs first (tests block in it).
	resolveErr  error
	getAgentErr error // when set, fails every GetAgent
	resolveHook func(*registryv1.ResolveProtocolRequest)

	mu        sync.Mutex // guards agents and protocols
	agents    map[string]*registryv1.Agent
	protocols map[string][]byte    // sha1 hex → content
	schemas   map[string][2]string // sha1 hex → request, response schema JSON
}

func newFakeRegistry() *fakeRegistry {
	return &fakeRegistry{agents: map[string]*registryv1.Agent{}, protocols: map[string][]byte{}, schemas: map[string][2]string{}}
}

func (f *fakeRegistry) addAgent(a *registryv1.Agent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.agents[a.GetName()] = a
}

func (f *fakeRegistry) addProtocol(content string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := sha1Hex([]byte(content))
	f.protocols[h] = []byte(content)
	return h
}

// addProtocolSchemas stores a PD whose metadata declares the given schemas.
func (f *fakeRegistry) addProtocolSchemas(content, request, response string) string {
	h := f.addProtocol(content)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.schemas[h] = [2]string{request, response}
	return h
}

func (f *fakeRegistry) GetAgent(_ context.Context, req *registryv1.GetAgentRequest) (*registryv1.Agent, error) {
	f.getAgentCalls.Add(1)
	if f.getAgentErr != nil {
		return nil, f.getAgentErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.agents[req.GetName()]
	if !ok {
		return nil, status.Error(codes.NotFound, "agent not found")
	}
	return a, nil
}

func (f *fakeRegistry) ResolveProtocol(_ context.Context, req *registryv1.ResolveProtocolRequest) (*registryv1.Protocol, error) {
	f.resolveCalls.Add(1)
	if f.resolveHook != nil {
		f.resolveHook(req)
	}
	if f.resolveErr != nil {
		return nil, f.resolveErr
	}
	h := strings.ToLower(req.GetHash())
	if len(h) == 28 {
		raw, err := base64.StdEncoding.DecodeString(req.GetHash())
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, "bad hash")
		}
		h = hex.EncodeToString(raw)
	}
	f.mu.Lock()
	content, ok := f.protocols[h]
	sch := f.schemas[h]
	f.mu.Unlock()
	if !ok {
		for _, src := range req.GetSources() {
			var b []byte
			switch {
			case strings.HasPrefix(src, "data:text/plain;charset=utf-8;base64,"):
				b, _ = base64.StdEncoding.DecodeString(strings.TrimPrefix(src, "data:text/plain;charset=utf-8;base64,"))
			case strings.HasPrefix(src, "data:text/plain;charset=utf-8,"):
				s, err := url.PathUnescape(strings.TrimPrefix(src, "data:text/plain;charset=utf-8,"))
				if err == nil {
					b = []byte(s)
				}
			}
			if b != nil && sha1Hex(b) == h {
				content, ok = b, true
				f.mu.Lock()
				f.protocols[h] = b
				f.mu.Unlock()
				break
			}
		}
	}
	if !ok {
		return nil, status.Error(codes.NotFound, "no source produced the protocol")
	}
	p := &registryv1.Protocol{Name: "protocols/" + h, Content: content, Sha1Hex: h, RequestSchemaJson: sch[0], ResponseSchemaJson: sch[1]}
	meta := string(content)
	if strings.Contains(meta, "multiround: true") {
		p.Multiround = true
	}
	if i := strings.Index(meta, "name: "); i >= 0 {
		p.Title = strings.SplitN(meta[i+6:], "\n", 2)[0]
	}
	return p, nil
}

// fakeLLM counts calls; reply scripts the answer (nil: not configured).
type fakeLLM struct {
	calls atomic.Int64
	reply func(LLMRequest) (LLMResult, error)
}

func (f *fakeLLM) Complete(_ context.Context, req LLMRequest) (LLMResult, error) {
	if f.reply == nil {
		return LLMResult{}, ErrNoLLM
	}
	f.calls.Add(1)
	return f.reply(req)
}

type testEnv struct {
	t        testing.TB
	reg      *fakeRegistry
	llm      *fakeLLM
	srv      *Server
	url      string // HTTP base URL
	conn     *grpc.ClientConn
	client   dispatcherv1.DispatcherServiceClient
	dataDir  string
	clockMu  sync.Mutex
	clockNow time.Time
}

func (e *testEnv) now() time.Time {
	e.clockMu.Lock()
	defer e.clockMu.Unlock()
	return e.clockNow
}

func (e *testEnv) advance(d time.Duration) {
	e.clockMu.Lock()
	defer e.clockMu.Unlock()
	e.clockNow = e.clockNow.Add(d)
}

// testOptions returns o with every limit it leaves zero set to a test
// value: New substitutes no defaults (the dispatcher's config owns them).
// testHTTPOptions are the Agora routes' counterpart.
func testOptions(o Options) Options {
	set := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	setInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	set(&o.ConversationTTL, 5*time.Minute)
	setInt(&o.MaxConversationsPerPeer, 100)
	setInt(&o.PaymentMaxOpen, 100)
	set(&o.PaymentRetention, 30*24*time.Hour)
	setInt(&o.QuarantineAfter, 3)
	set(&o.HandlerTimeout, 10*time.Second)
	setInt(&o.HandlerQueue, 64)
	set(&o.CacheTTL, 5*time.Second)
	set(&o.SendTimeout, 10*time.Second)
	setInt(&o.SendMaxListed, 5)
	if o.MessageMaxBodyBytes == 0 {
		o.MessageMaxBodyBytes = 64 << 10
	}
	set(&o.MessageTimeout, 10*time.Second)
	setInt(&o.MailboxOptions.Batch, 100)
	set(&o.MailboxOptions.Keepalive, 30*time.Second)
	set(&o.MailboxOptions.MaxDuration, time.Hour)
	set(&o.MailboxOptions.WriteTimeout, 30*time.Second)
	o.RoutineLimits = routinetest.Limits(o.RoutineLimits)
	return o
}

var testHTTPOptions = HTTPOptions{MaxBodyBytes: 1 << 20}

// startEnv runs a fake registry and a dispatcher (gRPC and Agora HTTP on
// loopback) over bbolt in dataDir ("" for a new temp dir).
func startEnv(t testing.TB, reg *fakeRegistry, dataDir string, opts Options) *testEnv {
	t.Helper()
	if reg == nil {
		reg = newFakeRegistry()
	}
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	e := &testEnv{t: t, reg: reg, llm: &fakeLLM{}, dataDir: dataDir, clockNow: time.Unix(1_800_000_000, 0)}

	regConn := serveGRPC(t, func(s *grpc.Server) { registryv1.RegisterRegistryServiceServer(s, reg) })

	st, err := boltstore.Open(dataDir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if opts.LLM == nil {
		opts.LLM = e.llm
	}
	if opts.Now == nil {
		opts.Now = e.now
	}
	if opts.SendLookup == nil {
		// Tests reach their targets on loopback. A test that injects the
		// resolver seam keeps the guard on: it tests the guard.
		opts.SendAllowPrivate = true
	}
	if opts.RoutineLimits.Pool == nil {
		opts.RoutineLimits.Pool = testPool(4)
	}
	t.Cleanup(func() { _ = opts.RoutineLimits.Pool.Close() })
	e.srv = New(st, slog.New(slog.DiscardHandler), registryv1.NewRegistryServiceClient(regConn), testOptions(opts))
	t.Cleanup(e.srv.StopShadows) // before the store closes

	e.conn = serveGRPC(t, func(s *grpc.Server) { dispatcherv1.RegisterDispatcherServiceServer(s, e.srv) })
	e.client = dispatcherv1.NewDispatcherServiceClient(e.conn)

	mux := http.NewServeMux()
	for p, h := range AgoraRoutes(e.srv, testHTTPOptions) {
		mux.Handle(p, h)
	}
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	e.url = hs.URL
	return e
}

// serveGRPC serves what register registers on a loopback listener until
// the test ends, and returns a client connection to it.
func serveGRPC(t testing.TB, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func agentRes(name string, dialect registryv1.Dialect, policy registryv1.SupportPolicy, supported ...string) *registryv1.Agent {
	a := &registryv1.Agent{Name: name, Dialect: dialect, SupportPolicy: policy}
	for _, h := range supported {
		a.SupportedProtocols = append(a.SupportedProtocols, &registryv1.SupportedProtocol{Protocol: "protocols/" + h, Sources: []string{"https://example.com/" + h}})
	}
	return a
}

func (e *testEnv) setRoutine(agent, id, src string) {
	e.t.Helper()
	_, err := e.client.SetRoutine(e.t.Context(), &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{Name: agent + "/routines/" + id, Source: src}})
	if err != nil {
		e.t.Fatalf("SetRoutine(%s) = %v", id, err)
	}
}

func (e *testEnv) setTable(agent, tool, entries string) {
	e.t.Helper()
	_, err := e.client.SetTool(e.t.Context(), &dispatcherv1.SetToolRequest{Tool: &dispatcherv1.Tool{
		Name: agent + "/tools/" + tool, Kind: &dispatcherv1.Tool_Table{Table: &dispatcherv1.TableTool{EntriesJson: entries}},
	}})
	if err != nil {
		e.t.Fatalf("SetTool(%s) = %v", tool, err)
	}
}

// do sends method path with body and returns the HTTP status and the reply
// decoded as a map (and its raw bytes).
func (e *testEnv) do(method, path, body string) (int, map[string]any, string) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.t.Context(), method, e.url+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		e.t.Fatalf("%s %s: reply %q is not a JSON object", method, path, raw)
	}
	return resp.StatusCode, m, string(raw)
}

func mustJSON(v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	return strings.TrimSpace(buf.String())
}

func bufCopy(w io.Writer, resp *http.Response) (int64, error) { return io.Copy(w, resp.Body) }

func bufCopyReq(w io.Writer, r *http.Request) (int64, error) { return io.Copy(w, r.Body) }

func fileSize(dir string) int64 {
	fi, err := os.Stat(filepath.Join(dir, boltstore.FileName))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// testPool is a pool of n routine workers with the dispatcher's default
// limits (NewPoolWith fills in none).
func testPool(n int) *routine.Pool {
	return routine.NewPoolWith(routine.PoolOptions{Workers: n, MemoryBytes: 256 << 20, KillMargin: 250 * time.Millisecond, WorkerCPU: 10 * time.Minute})
}
