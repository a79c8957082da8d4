package app_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/registry/app"
	"github.com/parleyhq/parley/services/registry/config"
)

// weatherPD is the canonical weather PD of specs/agora.md (no final newline).
const weatherPD = "---\nname: Weather Forecast Query Protocol\ndescription: Query the weather forecast for a given date and location.\nmultiround: false\n---\n\nThe sender sends a JSON object {\"date\": \"YYYY-MM-DD\", \"location\": string}.\nThe receiver replies with a JSON object {\"temperature\": number (degrees C), \"precipitation\": number (mm), \"weatherCondition\": one of \"sunny\", \"cloudy\", \"rainy\", \"snowy\"}.\nIf the location is unknown the receiver replies {\"error\": \"Unsupported location\"}."

const (
	weatherHex    = "3a732bde0e63d2e838d1a722feebf3d67b52b211"
	weatherBase64 = "OnMr3g5j0ug40aci/uvz1ntSshE="
)

// nonASCIIPD has non-ASCII text, CRLF and trailing blanks: bytes that any
// decoding, trimming or re-encoding would change.
const nonASCIIPD = "---\r\nname: Météo — prévisions\r\ndescription: Température en °C, 日本語.\r\n---\r\nLe corps: {\"ville\": \"Zürich\"}  \r\n\r\n"

type registry struct {
	client  registryv1.RegistryServiceClient
	grpc    string // gRPC address
	url     string // HTTP base URL
	cleanup func()
}

// startRegistry runs a registry on two loopback listeners with a fresh data
// directory; args are extra flags.
func startRegistry(t testing.TB, args ...string) *registry {
	t.Helper()
	cfg, err := config.Load(append([]string{"--data", t.TempDir()}, args...), func(string) string { return "" })
	if err != nil {
		t.Fatalf("config.Load(%q) error = %v", args, err)
	}
	logger := slog.New(slog.DiscardHandler)
	peers, err := app.DialPeers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peers.Close() })
	a, err := app.New(cfg, logger, peers)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := serve.New(serve.Options{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Register(ctx, srv); err != nil {
		t.Fatal(err)
	}
	grpcLis := listen(t)
	httpLis := listen(t)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, grpcLis, httpLis) }()
	conn, err := grpc.NewClient(grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r := &registry{
		client: registryv1.NewRegistryServiceClient(conn),
		grpc:   grpcLis.Addr().String(),
		url:    "http://" + httpLis.Addr().String(),
	}
	var once sync.Once
	r.cleanup = func() {
		once.Do(func() {
			conn.Close()
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run() error = %v", err)
			}
			a.Close()
		})
	}
	t.Cleanup(r.cleanup)
	return r
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

type response struct {
	code   int
	header http.Header
	body   []byte
}

func do(t *testing.T, method, url, body string, header ...string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{code: resp.StatusCode, header: resp.Header, body: b}
}

func createJSON(content string) string {
	return fmt.Sprintf(`{"content":%q}`, base64.StdEncoding.EncodeToString([]byte(content)))
}

func TestGatewayErrors(t *testing.T) {
	r := startRegistry(t)
	victim := listen(t) // a loopback service that must never be reached
	t.Cleanup(func() { victim.Close() })
	if _, err := r.client.CreateAgent(t.Context(), &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "weather", Agent: &registryv1.Agent{}}); err != nil {
		t.Fatal(err)
	}
	unknownHex := strings.Repeat("ab", 20)
	const badMetadataPD = "---\nstateMachine: 3\n---\nx"
	resolve := func(hash string, sources ...string) string {
		b, _ := json.Marshal(map[string]any{"hash": hash, "sources": sources})
		return string(b)
	}
	tests := []struct {
		name, method, path, body string
		wantCode                 int
		wantInMsg                string
	}{
		{"malformed hash", "GET", "/v1/protocols/xyz", "", 400, "name"},
		{"unknown protocol", "GET", "/v1/protocols/" + unknownHex, "", 404, unknownHex},
		{"empty document", "POST", "/v1/protocols", `{"content":""}`, 400, "protocol.content"},
		{"document over the limit", "POST", "/v1/protocols", createJSON(strings.Repeat("x", 256<<10+1)), 413, "protocol.content"},
		{"invalid request schema", "POST", "/v1/protocols", createJSON("---\nrequestSchema: {type: 7}\n---\nx"), 400, "requestSchema"},
		{"invalid state machine", "POST", "/v1/protocols", createJSON("---\nstateMachine: {roles: [a], messages: [{type: m, sender: z}]}\n---\nx"), 400, "stateMachine"},
		{"resolve malformed hash", "POST", "/v1/protocols:resolve", resolve("nope"), 400, "hash"},
		{"resolve without sources", "POST", "/v1/protocols:resolve", resolve(unknownHex), 404, "no source"},
		{"resolve private source", "POST", "/v1/protocols:resolve", resolve(unknownHex, "https://10.0.0.1/pd"), 400, `sources[0] "https://10.0.0.1/pd"`},
		{"resolve metadata source", "POST", "/v1/protocols:resolve", resolve(unknownHex, "https://169.254.169.254/latest/meta-data"), 400, "destination refused"},
		{"resolve loopback source", "POST", "/v1/protocols:resolve", resolve(unknownHex, "https://"+victim.Addr().String()+"/pd"), 400, "destination refused"},
		{"resolve http source", "POST", "/v1/protocols:resolve", resolve(unknownHex, "http://example.com/pd"), 400, "http sources are not allowed"},
		{"resolve malformed data URI", "POST", "/v1/protocols:resolve", resolve(unknownHex, "data:text/plain;charset=utf-8;base64,@@@"), 400, "base64"},
		{"resolve wrong data URI prefix", "POST", "/v1/protocols:resolve", resolve(unknownHex, "data:text/plain,hello"), 400, "data: URI must start"},
		{"resolve hash mismatch", "POST", "/v1/protocols:resolve", resolve(unknownHex, "data:text/plain;charset=utf-8,hello"), 400, "aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d"},
		{"resolve over the limit", "POST", "/v1/protocols:resolve", resolve(unknownHex, "data:text/plain;charset=utf-8,"+strings.Repeat("x", 256<<10+1)), 413, "limit"},
		{"resolve invalid metadata", "POST", "/v1/protocols:resolve", resolve(fmt.Sprintf("%x", sha1Sum(badMetadataPD)), "data:text/plain;charset=utf-8,"+url.PathEscape(badMetadataPD)), 400, "sources[0]: metadata key stateMachine"},
		{"search without query", "GET", "/v1/protocols:search", "", 400, "query"},
		{"bad page token", "GET", "/v1/protocols?page_token=garbage", "", 400, "page_token"},
		{"negative page size", "GET", "/v1/protocols?page_size=-1", "", 400, "page_size"},
		{"unknown agent", "GET", "/v1/clients/acme/agents/nope", "", 404, "clients/acme/agents/nope"},
		{"bad agent id", "POST", "/v1/clients/acme/agents?agent_id=Bad_Id", `{}`, 400, "agent_id"},
		{"duplicate agent", "POST", "/v1/clients/acme/agents?agent_id=weather", `{}`, 409, "already exists"},
		{"support malformed hash", "POST", "/v1/clients/acme/agents/weather:addSupportedProtocol", `{"protocol":"zz"}`, 400, "protocol"},
		{"support unknown protocol", "POST", "/v1/clients/acme/agents/weather:addSupportedProtocol", `{"protocol":"` + unknownHex + `"}`, 400, unknownHex},
		{"support bad source", "POST", "/v1/clients/acme/agents/weather:addSupportedProtocol", `{"protocol":"` + weatherHex + `","sources":["ftp://x/y"]}`, 400, "sources[0]"},
		{"update unknown mask path", "PATCH", "/v1/clients/acme/agents/weather?update_mask=display_name,bogus", `{"displayName":"x"}`, 400, "bogus"},
		{"update bad dialect", "PATCH", "/v1/clients/acme/agents/weather", `{"dialect":7}`, 400, "agent.dialect"},
		{"update stale etag", "PATCH", "/v1/clients/acme/agents/weather", `{"displayName":"x","etag":"stale"}`, 409, "changed since it was read"},
		{"update unknown agent", "PATCH", "/v1/clients/acme/agents/ghost", `{"displayName":"x"}`, 404, "ghost"},
		{"long request id", "POST", "/v1/clients/acme/agents/weather:addUnsupportedProtocol", `{"protocol":"` + weatherHex + `","requestId":"` + strings.Repeat("r", 129) + `"}`, 400, "request_id"},
		{"support on unknown agent", "POST", "/v1/clients/acme/agents/ghost:addUnsupportedProtocol", `{"protocol":"` + weatherHex + `"}`, 404, "ghost"},
		{"sync unknown peer", "POST", "/v1/protocols:sync", `{"peer":"elsewhere:9090"}`, 400, "elsewhere:9090"},
		{"raw malformed hash", "GET", "/protocols/nope", "", 400, "hash"},
		{"raw unknown", "GET", "/protocols/" + unknownHex, "", 404, unknownHex},
		{"discovery unknown agent", "GET", "/agora/acme/ghost/.wellknown", "", 404, "ghost"},
		{"discovery bad detail", "GET", "/agora/acme/weather/wellknown?detail=some", "", 400, "detail"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := do(t, tt.method, r.url+tt.path, tt.body)
			var body struct {
				Message string `json:"message"`
			}
			if err := json.Unmarshal(resp.body, &body); err != nil {
				t.Fatalf("%s %s: body %q is not the JSON error shape: %v", tt.method, tt.path, resp.body, err)
			}
			if resp.code != tt.wantCode || !strings.Contains(body.Message, tt.wantInMsg) {
				t.Errorf("%s %s = %d %q; want %d mentioning %q", tt.method, tt.path, resp.code, body.Message, tt.wantCode, tt.wantInMsg)
			}
		})
	}
	// No failure left a partial record.
	list, err := r.client.ListProtocols(t.Context(), &registryv1.ListProtocolsRequest{})
	if err != nil || len(list.GetProtocols()) != 0 {
		t.Errorf("ListProtocols() after failures = %v, %v; want none stored", list.GetProtocols(), err)
	}
	a, err := r.client.GetAgent(t.Context(), &registryv1.GetAgentRequest{Name: "clients/acme/agents/weather"})
	if err != nil || len(a.GetSupportedProtocols())+len(a.GetUnsupportedProtocols()) != 0 || a.GetDisplayName() != "" {
		t.Errorf("GetAgent() after failures = %v, %v; want no protocol entries, no display name", a, err)
	}
	if err := victim.(*net.TCPListener).SetDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if c, err := victim.Accept(); err == nil {
		c.Close()
		t.Error("the loopback victim received a connection")
	}
}

func TestCreateOverGRPCReadOverREST(t *testing.T) {
	r := startRegistry(t)
	ctx := t.Context()
	created, err := r.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(weatherPD)}})
	if err != nil {
		t.Fatalf("CreateProtocol() error = %v", err)
	}
	if created.GetSha1Hex() != weatherHex || created.GetSha1Base64() != weatherBase64 || created.GetTitle() != "Weather Forecast Query Protocol" || created.GetOrigin() != "api" {
		t.Errorf("CreateProtocol() = %v; want the spec's hashes and metadata", created)
	}
	again, err := r.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(weatherPD)}})
	if err != nil || !again.GetCreateTime().AsTime().Equal(created.GetCreateTime().AsTime()) {
		t.Errorf("CreateProtocol(again) = %v, %v; want the stored protocol", again, err)
	}
	// Hex in any case over REST (base64: TestGatewayBase64HashInPath).
	for _, name := range []string{weatherHex, strings.ToUpper(weatherHex)} {
		resp := do(t, "GET", r.url+"/v1/protocols/"+name, "")
		var got struct {
			Content string `json:"content"`
			Sha1Hex string `json:"sha1Hex"`
		}
		if err := json.Unmarshal(resp.body, &got); err != nil || resp.code != 200 {
			t.Fatalf("GET /v1/protocols/%s = %d %s", name, resp.code, resp.body)
		}
		if b, _ := base64.StdEncoding.DecodeString(got.Content); string(b) != weatherPD || got.Sha1Hex != weatherHex {
			t.Errorf("GET /v1/protocols/%s returned other content or hash %s", name, got.Sha1Hex)
		}
	}
	for _, name := range []string{url.PathEscape(weatherBase64), strings.NewReplacer("/", "%2F", "=", "%3D").Replace(weatherBase64)} {
		if resp := do(t, "GET", r.url+"/protocols/"+name, ""); resp.code != 200 || string(resp.body) != weatherPD {
			t.Errorf("GET /protocols/%s = %d %q; want the document", name, resp.code, resp.body)
		}
	}
	// ResolveProtocol finds the stored document by base64, with no sources.
	res, err := r.client.ResolveProtocol(ctx, &registryv1.ResolveProtocolRequest{Hash: weatherBase64})
	if err != nil || string(res.GetContent()) != weatherPD {
		t.Errorf("ResolveProtocol(base64) = %v, %v", res, err)
	}
}

func TestNonASCIIDocumentRoundTrip(t *testing.T) {
	origin := startRegistry(t)
	ctx := t.Context()
	p, err := origin.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(nonASCIIPD)}})
	if err != nil {
		t.Fatal(err)
	}
	raw := origin.url + "/protocols/" + p.GetSha1Hex()

	resp := do(t, "GET", raw, "")
	if resp.code != 200 || !bytes.Equal(resp.body, []byte(nonASCIIPD)) {
		t.Fatalf("GET %s = %d %q; want the exact bytes", raw, resp.code, resp.body)
	}
	wantHeader := map[string]string{"Content-Type": "text/plain; charset=utf-8", "Etag": `"` + p.GetSha1Hex() + `"`, "Content-Length": fmt.Sprint(len(nonASCIIPD))}
	for k, v := range wantHeader {
		if got := resp.header.Get(k); got != v {
			t.Errorf("GET %s header %s = %q, want %q", raw, k, got, v)
		}
	}
	if head := do(t, "HEAD", raw, ""); head.code != 200 || len(head.body) != 0 || head.header.Get("Etag") != wantHeader["Etag"] {
		t.Errorf("HEAD %s = %d, %d body bytes, etag %q", raw, head.code, len(head.body), head.header.Get("Etag"))
	}
	if cond := do(t, "GET", raw, "", "If-None-Match", `W/"x", `+wantHeader["Etag"]); cond.code != http.StatusNotModified || len(cond.body) != 0 {
		t.Errorf("conditional GET %s = %d; want 304", raw, cond.code)
	}
	if cond := do(t, "GET", raw, "", "If-None-Match", `"other"`); cond.code != 200 {
		t.Errorf("GET %s with a stale tag = %d; want 200", raw, cond.code)
	}
	b64 := origin.url + "/protocols/" + url.PathEscape(p.GetSha1Base64())
	if got := do(t, "GET", b64, ""); got.code != 200 || !bytes.Equal(got.body, []byte(nonASCIIPD)) {
		t.Errorf("GET %s = %d; want the document", b64, got.code)
	}

	// Another registry fetches it from that URL (loopback allowlisted for
	// the test) and verifies its SHA-1 on the raw bytes.
	fetcher := startRegistry(t, "--pd-fetch-allow-http", "--pd-fetch-allow", "127.0.0.1")
	got, err := fetcher.client.ResolveProtocol(ctx, &registryv1.ResolveProtocolRequest{Hash: p.GetSha1Base64(), Sources: []string{"https://10.0.0.1/pd", raw}})
	if err != nil {
		t.Fatalf("ResolveProtocol(from %s) error = %v", raw, err)
	}
	if !bytes.Equal(got.GetContent(), []byte(nonASCIIPD)) || got.GetOrigin() != raw || got.GetSha256Hex() != p.GetSha256Hex() {
		t.Errorf("ResolveProtocol() = origin %q, sha256 %s; want the exact document from %s", got.GetOrigin(), got.GetSha256Hex(), raw)
	}
	fetched := do(t, "GET", fetcher.url+"/protocols/"+p.GetSha1Hex(), "")
	if !bytes.Equal(fetched.body, []byte(nonASCIIPD)) {
		t.Errorf("the fetching registry serves %q; want the exact bytes", fetched.body)
	}
}

func TestPagingToTheEnd(t *testing.T) {
	r := startRegistry(t)
	ctx := t.Context()
	const n = 7
	want := map[string]bool{}
	for i := range n {
		doc := fmt.Sprintf("---\nname: Doc %d\ntags: [%s]\n---\nBody %d.", i, []string{"even", "odd"}[i%2], i)
		p, err := r.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(doc)}})
		if err != nil {
			t.Fatal(err)
		}
		want[p.GetSha1Hex()] = true
	}
	collect := func(path string) []string {
		var hashes []string
		token := ""
		for pages := 0; ; pages++ {
			if pages > n {
				t.Fatalf("%s did not end", path)
			}
			resp := do(t, "GET", r.url+path+"page_size=3&page_token="+url.QueryEscape(token), "")
			var page struct {
				Protocols []struct {
					Sha1Hex string `json:"sha1Hex"`
					Content string `json:"content"`
				} `json:"protocols"`
				NextPageToken string `json:"nextPageToken"`
			}
			if err := json.Unmarshal(resp.body, &page); err != nil || resp.code != 200 {
				t.Fatalf("GET %s = %d %s", path, resp.code, resp.body)
			}
			for _, p := range page.Protocols {
				if p.Content != "" {
					t.Errorf("%s returned content", path)
				}
				hashes = append(hashes, p.Sha1Hex)
			}
			if page.NextPageToken == "" {
				return hashes
			}
			token = page.NextPageToken
		}
	}
	all := collect("/v1/protocols?")
	if len(all) != n {
		t.Errorf("paging listed %d protocols, want %d", len(all), n)
	}
	for _, h := range all {
		if !want[h] {
			t.Errorf("paging listed unknown %s", h)
		}
	}
	if odd := collect("/v1/protocols:search?query=ODD&"); len(odd) != 3 {
		t.Errorf("search odd listed %d protocols, want 3", len(odd))
	}
	if none := collect("/v1/protocols:search?query=nothing-matches&"); len(none) != 0 {
		t.Errorf("search listed %v, want none", none)
	}
}

func TestDiscoveryShapes(t *testing.T) {
	r := startRegistry(t)
	ctx := t.Context()
	c := r.client
	if _, err := c.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "weather", Agent: &registryv1.Agent{DisplayName: "Weather", Dialect: registryv1.Dialect_DIALECT_STD}}); err != nil {
		t.Fatal(err)
	}
	weather, err := c.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(weatherPD)}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte("---\nname: Other\ndescription: Not for us.\n---\nx")}})
	if err != nil {
		t.Fatal(err)
	}
	const agent = "clients/acme/agents/weather"
	// Supported with the registry's own URL (default), then also supported
	// with a data: URI, which replaces the entry.
	if _, err := c.AddSupportedProtocol(ctx, &registryv1.AddSupportedProtocolRequest{Name: agent, Protocol: weatherBase64}); err != nil {
		t.Fatal(err)
	}
	// Unsupported first supported, to prove a protocol is in one list only.
	if _, err := c.AddSupportedProtocol(ctx, &registryv1.AddSupportedProtocolRequest{Name: agent, Protocol: other.GetName()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddUnsupportedProtocol(ctx, &registryv1.AddUnsupportedProtocolRequest{Name: agent, Protocol: other.GetSha1Hex(), Comment: "we only do weather"}); err != nil {
		t.Fatal(err)
	}
	unknownHex := strings.Repeat("cd", 20)
	a, err := c.AddUnsupportedProtocol(ctx, &registryv1.AddUnsupportedProtocolRequest{Name: agent, Protocol: unknownHex})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.GetSupportedProtocols()) != 1 || len(a.GetUnsupportedProtocols()) != 2 || a.GetDialect() != registryv1.Dialect_DIALECT_STD {
		t.Fatalf("agent after support changes = %v", a)
	}

	wantSource := r.url + "/protocols/" + weather.GetSha1Hex()
	for _, path := range []string{"/agora/acme/weather/.wellknown", "/agora/acme/weather/wellknown"} {
		resp := do(t, "GET", r.url+path, "")
		if resp.code != 200 || resp.header.Get("Content-Type") != "application/json" {
			t.Fatalf("GET %s = %d %s", path, resp.code, resp.header.Get("Content-Type"))
		}
		var got map[string][]string
		if err := json.Unmarshal(resp.body, &got); err != nil {
			t.Fatalf("GET %s body %s: %v", path, resp.body, err)
		}
		if diff := cmp.Diff(map[string][]string{weather.GetSha1Hex(): {wantSource}}, got); diff != "" {
			t.Errorf("GET %s (-want +got):\n%s", path, diff)
		}
	}
	// The advertised source serves the document.
	if src := do(t, "GET", wantSource, ""); src.code != 200 || string(src.body) != weatherPD {
		t.Errorf("GET %s = %d", wantSource, src.code)
	}

	resp := do(t, "GET", r.url+"/agora/acme/weather/.wellknown?detail=full", "")
	var full map[string]map[string]map[string]any
	if err := json.Unmarshal(resp.body, &full); err != nil {
		t.Fatalf("detail=full body %s: %v", resp.body, err)
	}
	want := map[string]map[string]map[string]any{
		"supported": {weather.GetSha1Hex(): {
			"sources": []any{wantSource}, "name": "Weather Forecast Query Protocol",
			"description": "Query the weather forecast for a given date and location.", "multiround": false,
		}},
		"unsupported": {
			other.GetSha1Hex(): {"comment": "we only do weather", "name": "Other", "description": "Not for us."},
			unknownHex:         {},
		},
	}
	if diff := cmp.Diff(want, full); diff != "" {
		t.Errorf("detail=full (-want +got):\n%s", diff)
	}

	// Removing the only supported protocol empties the standard shape.
	if _, err := c.RemoveSupportedProtocol(ctx, &registryv1.RemoveSupportedProtocolRequest{Name: agent, Protocol: weatherHex}); err != nil {
		t.Fatal(err)
	}
	if got := do(t, "GET", r.url+"/agora/acme/weather/.wellknown", ""); strings.TrimSpace(string(got.body)) != "{}" {
		t.Errorf("wellknown after removal = %s, want {}", got.body)
	}
}

func TestDiscoveryUsesPublicURL(t *testing.T) {
	r := startRegistry(t, "--public-url", "https://parley.example.com/")
	ctx := t.Context()
	if _, err := r.client.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "w", Agent: &registryv1.Agent{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(weatherPD)}}); err != nil {
		t.Fatal(err)
	}
	a, err := r.client.AddSupportedProtocol(ctx, &registryv1.AddSupportedProtocolRequest{Name: "clients/acme/agents/w", Protocol: weatherHex})
	if err != nil {
		t.Fatal(err)
	}
	want := "https://parley.example.com/protocols/" + weatherHex
	if got := a.GetSupportedProtocols()[0].GetSources(); len(got) != 1 || got[0] != want {
		t.Errorf("default sources = %v, want [%s]", got, want)
	}
	var shape map[string][]string
	if err := json.Unmarshal(do(t, "GET", r.url+"/agora/acme/w/.wellknown", "").body, &shape); err != nil || shape[weatherHex][0] != want {
		t.Errorf("wellknown = %v, %v; want %s", shape, err, want)
	}
}

func TestGatewayProcessRoutes(t *testing.T) {
	r := startRegistry(t)
	ctx := t.Context()
	if _, err := r.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(nonASCIIPD)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "w", Agent: &registryv1.Agent{}}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(r.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	gw, err := serve.New(serve.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	gctx, cancel := context.WithCancel(context.Background())
	if err := app.RegisterGateway(gctx, gw, conn, nil); err != nil {
		t.Fatal(err)
	}
	httpLis := listen(t)
	done := make(chan error, 1)
	go func() { done <- gw.Run(gctx, listen(t), httpLis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() error = %v", err)
		}
	})
	base := "http://" + httpLis.Addr().String()
	h := fmt.Sprintf("%x", sha1Sum(nonASCIIPD))
	if got := do(t, "GET", base+"/protocols/"+h, ""); got.code != 200 || string(got.body) != nonASCIIPD {
		t.Errorf("gateway GET /protocols/%s = %d %q", h, got.code, got.body)
	}
	if got := do(t, "GET", base+"/agora/acme/w/.wellknown", ""); got.code != 200 || strings.TrimSpace(string(got.body)) != "{}" {
		t.Errorf("gateway wellknown = %d %s", got.code, got.body)
	}
	if got := do(t, "GET", base+"/agora/acme/ghost/wellknown", ""); got.code != 404 {
		t.Errorf("gateway wellknown of unknown agent = %d, want 404", got.code)
	}
}

func TestPeerRegistries(t *testing.T) {
	ctx := t.Context()
	a := startRegistry(t)
	var hashes []string
	for i := range 3 {
		p, err := a.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(fmt.Sprintf("peer doc %d é", i))}})
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, p.GetSha1Hex())
	}
	b := startRegistry(t, "--registry-peers", a.grpc)
	got, err := b.client.ResolveProtocol(ctx, &registryv1.ResolveProtocolRequest{Hash: hashes[0]})
	if err != nil || got.GetOrigin() != "peer:"+a.grpc || string(got.GetContent()) != "peer doc 0 é" {
		t.Fatalf("ResolveProtocol(via peer) = %v, %v", got, err)
	}
	sync, err := b.client.SyncProtocols(ctx, &registryv1.SyncProtocolsRequest{Peer: a.grpc})
	if err != nil || sync.GetCopiedCount() != 2 || sync.GetPresentCount() != 1 || len(sync.GetFailures()) != 0 {
		t.Fatalf("SyncProtocols() = %v, %v; want 2 copied, 1 present", sync, err)
	}
	for _, h := range hashes {
		if _, err := b.client.GetProtocol(ctx, &registryv1.GetProtocolRequest{Name: "protocols/" + h}); err != nil {
			t.Errorf("GetProtocol(%s) on the synced registry: %v", h, err)
		}
	}
	// A peer that is down: resolve still answers from sources, sync says
	// UNAVAILABLE.
	a.cleanup()
	_, err = b.client.SyncProtocols(ctx, &registryv1.SyncProtocolsRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("SyncProtocols(peer down) error = %v, want Unavailable", err)
	}
	doc := "data only"
	got, err = b.client.ResolveProtocol(ctx, &registryv1.ResolveProtocolRequest{Hash: fmt.Sprintf("%x", sha1Sum(doc)), Sources: []string{"data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(doc))}})
	if err != nil || string(got.GetContent()) != doc {
		t.Errorf("ResolveProtocol(peer down, data source) = %v, %v", got, err)
	}
}

func TestResolveSilentSourceEndsWithinBudget(t *testing.T) {
	silent := silentListener(t)
	const budget = 100 * time.Millisecond
	r := startRegistry(t, "--pd-fetch-allow-http", "--pd-fetch-allow", silent.Addr().String(), "--pd-fetch-timeout", budget.String())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a backstop: a lost budget fails, not hangs
	defer cancel()
	start := time.Now()
	_, err := r.client.ResolveProtocol(ctx, &registryv1.ResolveProtocolRequest{Hash: strings.Repeat("ef", 20), Sources: []string{"http://" + silent.Addr().String() + "/pd"}})
	elapsed := time.Since(start)
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "timed out") {
		t.Errorf("ResolveProtocol(silent source) error = %v; want NOT_FOUND saying it timed out", err)
	}
	if elapsed > fetchBudgetBound {
		t.Errorf("ResolveProtocol(silent source) took %v; want the %v budget to end it (bound %v)", elapsed, budget, fetchBudgetBound)
	}
}

// fetchBudgetBound bounds a resolution that only its --pd-fetch-timeout
// budget (100ms in these tests) can end. Contract: the budget ends the
// resolution. The bound is a margin, not a speed: 45 times the budget for a
// loaded CI machine, yet under the 5s default that a flag lost between
// config and fetcher would fall back to.
const fetchBudgetBound = 4500 * time.Millisecond

// TestGatewayBase64HashInPath proves a base64 hash holding '/' and '+'
// travels in a gateway path when '/' is escaped as %2F: the gateway keeps
// reserved escapes inside a segment.
func TestGatewayBase64HashInPath(t *testing.T) {
	r := startRegistry(t)
	// Find a document whose base64 SHA-1 holds both '/' and '+'.
	var doc string
	var sum [20]byte
	for i := 0; ; i++ {
		doc = fmt.Sprintf("---\nname: Slash plus %d\n---\nx", i)
		sum = sha1Sum(doc)
		if b := base64.StdEncoding.EncodeToString(sum[:]); strings.Contains(b, "/") && strings.Contains(b, "+") {
			break
		}
	}
	if _, err := r.client.CreateProtocol(t.Context(), &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(doc)}}); err != nil {
		t.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString(sum[:])
	for _, escaped := range []string{
		url.PathEscape(b64), // '/' → %2F; '+' and '=' stay
		strings.NewReplacer("/", "%2F", "+", "%2B", "=", "%3D").Replace(b64),
	} {
		resp := do(t, "GET", r.url+"/v1/protocols/"+escaped, "")
		var got struct {
			Sha1Hex string `json:"sha1Hex"`
		}
		if err := json.Unmarshal(resp.body, &got); err != nil || resp.code != 200 || got.Sha1Hex != fmt.Sprintf("%x", sum) {
			t.Errorf("GET /v1/protocols/%s = %d %s; want protocol %x", escaped, resp.code, resp.body, sum)
		}
	}
}

func TestUpdateAgent(t *testing.T) {
	r := startRegistry(t)
	ctx := t.Context()
	const name = "clients/acme/agents/w"
	created, err := r.client.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "w", Agent: &registryv1.Agent{DisplayName: "W", Description: "Kept."}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(weatherPD)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.AddSupportedProtocol(ctx, &registryv1.AddSupportedProtocolRequest{Name: name, Protocol: weatherHex}); err != nil {
		t.Fatal(err)
	}

	// PATCH with only displayName: the gateway's mask names it alone.
	resp := do(t, "PATCH", r.url+"/v1/"+name, `{"displayName":"Weather","dialect":"DIALECT_STD"}`)
	var got map[string]any
	if err := json.Unmarshal(resp.body, &got); err != nil || resp.code != 200 {
		t.Fatalf("PATCH /v1/%s = %d %s", name, resp.code, resp.body)
	}
	if got["displayName"] != "Weather" || got["description"] != "Kept." || got["dialect"] != "DIALECT_STD" || got["etag"] == created.GetEtag() {
		t.Errorf("PATCH displayName, dialect = %v; want them changed, description kept, a new etag", got)
	}

	// PATCH back a whole Agent as read: name, etag and output-only fields
	// are ignored, the protocol lists survive.
	got["description"] = "Changed."
	body, _ := json.Marshal(got)
	if resp := do(t, "PATCH", r.url+"/v1/"+name, string(body)); resp.code != 200 {
		t.Fatalf("PATCH whole agent = %d %s", resp.code, resp.body)
	}
	a, err := r.client.GetAgent(ctx, &registryv1.GetAgentRequest{Name: name})
	if err != nil || a.GetDescription() != "Changed." || len(a.GetSupportedProtocols()) != 1 || !a.GetCreateTime().AsTime().Equal(created.GetCreateTime().AsTime()) {
		t.Errorf("GetAgent() after PATCH of a whole agent = %v, %v; want description changed, the rest kept", a, err)
	}

	// "*" sets every mutable field, clearing those left empty.
	cleared, err := r.client.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{
		Agent:      &registryv1.Agent{Name: name, SupportPolicy: registryv1.SupportPolicy_SUPPORT_POLICY_IMPLEMENTED},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"*"}},
	})
	if err != nil || cleared.GetDisplayName() != "" || cleared.GetDescription() != "" || cleared.GetDialect() != registryv1.Dialect_DIALECT_UNSPECIFIED || cleared.GetSupportPolicy() != registryv1.SupportPolicy_SUPPORT_POLICY_IMPLEMENTED {
		t.Errorf("UpdateAgent(mask *) = %v, %v; want only support_policy set", cleared, err)
	}

	// Lost update: two writers read the same etag; the second one loses.
	read, err := r.client.GetAgent(ctx, &registryv1.GetAgentRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	mask := &fieldmaskpb.FieldMask{Paths: []string{"display_name"}}
	if _, err := r.client.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: name, DisplayName: "first", Etag: read.GetEtag()}, UpdateMask: mask}); err != nil {
		t.Fatalf("UpdateAgent(first writer) error = %v", err)
	}
	_, err = r.client.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: name, DisplayName: "second", Etag: read.GetEtag()}, UpdateMask: mask})
	if status.Code(err) != codes.Aborted {
		t.Errorf("UpdateAgent(second writer, stale etag) error = %v, want ABORTED", err)
	}
	if a, err := r.client.GetAgent(ctx, &registryv1.GetAgentRequest{Name: name}); err != nil || a.GetDisplayName() != "first" {
		t.Errorf("GetAgent() after the lost update = %q, %v; want the first writer's value", a.GetDisplayName(), err)
	}

	invalid := []struct {
		name string
		req  *registryv1.UpdateAgentRequest
	}{
		{"no agent", &registryv1.UpdateAgentRequest{}},
		{"bad name", &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: "agents/w", DisplayName: "x"}}},
		{"unknown path", &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: name}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"owner.country"}}}},
		{"star with another path", &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: name}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"*", "dialect"}}}},
		{"long display name", &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: name, DisplayName: strings.Repeat("x", 201)}}},
		{"bad support policy", &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: name, SupportPolicy: 9}}},
	}
	for _, tt := range invalid {
		if _, err := r.client.UpdateAgent(ctx, tt.req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("UpdateAgent(%s) error = %v, want INVALID_ARGUMENT", tt.name, err)
		}
	}
}

func TestRequestIDs(t *testing.T) {
	r := startRegistry(t)
	ctx := t.Context()
	const name = "clients/acme/agents/w"
	create := func(requestID string) (*registryv1.Agent, error) {
		return r.client.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "w", Agent: &registryv1.Agent{DisplayName: "W"}, RequestId: requestID})
	}
	first, err := create("7d1c8f1e-create")
	if err != nil {
		t.Fatal(err)
	}
	// The first result, less the initial key's secret: it is shown once.
	firstKey := first.GetInitialKey()
	first.InitialKey = nil
	if again, err := create("7d1c8f1e-create"); err != nil || !proto.Equal(again, first) {
		t.Errorf("CreateAgent(repeated request_id) = %v, %v; want the first result %v without its key", again, err, first)
	}
	if firstKey.GetSecret() == "" {
		t.Errorf("CreateAgent() initial_key = %v, want a secret", firstKey)
	}
	if _, err := create("another"); status.Code(err) != codes.AlreadyExists {
		t.Errorf("CreateAgent(new request_id) error = %v, want ALREADY_EXISTS", err)
	}

	// A repeated custom method does not act again: the protocol removed in
	// between stays removed, and the first result comes back.
	unknown := strings.Repeat("ab", 20)
	add := &registryv1.AddUnsupportedProtocolRequest{Name: name, Protocol: unknown, Comment: "no", RequestId: "add-1"}
	added, err := r.client.AddUnsupportedProtocol(ctx, add)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.RemoveUnsupportedProtocol(ctx, &registryv1.RemoveUnsupportedProtocolRequest{Name: name, Protocol: unknown}); err != nil {
		t.Fatal(err)
	}
	if again, err := r.client.AddUnsupportedProtocol(ctx, add); err != nil || !proto.Equal(again, added) {
		t.Errorf("AddUnsupportedProtocol(repeated request_id) = %v, %v; want the first result %v", again, err, added)
	}
	if a, err := r.client.GetAgent(ctx, &registryv1.GetAgentRequest{Name: name}); err != nil || len(a.GetUnsupportedProtocols()) != 0 {
		t.Errorf("GetAgent() after the repeat = %v, %v; want the removal kept", a, err)
	}
	// The same id on another method is another request.
	if _, err := r.client.RemoveUnsupportedProtocol(ctx, &registryv1.RemoveUnsupportedProtocolRequest{Name: name, Protocol: unknown, RequestId: "add-1"}); err != nil {
		t.Errorf("RemoveUnsupportedProtocol(id used by another method) error = %v", err)
	}
}

func TestResolveFetchCapacityIs429(t *testing.T) {
	hit := make(chan struct{}, 1)
	release := make(chan struct{})
	src := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		select {
		case hit <- struct{}{}:
		default:
		}
		<-release
		_, _ = io.WriteString(w, "late") // released at cleanup; the client may be gone
	})}
	srcLis := listen(t)
	go func() { _ = src.Serve(srcLis) }() // ErrServerClosed once cleanup closes it
	t.Cleanup(func() { src.Close() })
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	r := startRegistry(t, "--pd-fetch-allow-http", "--pd-fetch-allow", srcLis.Addr().String(),
		"--pd-fetch-max-concurrent", "1", "--pd-fetch-max-per-host", "1", "--pd-fetch-connect-timeout", "100ms")
	sourceURL := "http://" + srcLis.Addr().String() + "/pd"

	held := make(chan error, 1)
	go func() {
		_, err := r.client.ResolveProtocol(context.Background(), &registryv1.ResolveProtocolRequest{Hash: strings.Repeat("01", 20), Sources: []string{sourceURL}})
		held <- err
	}()
	select { // the first resolution holds the only fetch slot
	case <-hit:
	case err := <-held:
		t.Fatalf("ResolveProtocol(slot holder) ended before reaching the source: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the slot holder's source was never asked")
	}
	body := fmt.Sprintf(`{"hash":%q,"sources":[%q]}`, strings.Repeat("02", 20), sourceURL)
	resp := do(t, "POST", r.url+"/v1/protocols:resolve", body)
	if resp.code != http.StatusTooManyRequests || !bytes.Contains(resp.body, []byte("FETCH_CAPACITY_EXHAUSTED")) {
		t.Errorf("POST /v1/protocols:resolve with every fetch slot taken = %d %s; want 429 FETCH_CAPACITY_EXHAUSTED", resp.code, resp.body)
	}
	unblock()
	if err := <-held; status.Code(err) != codes.InvalidArgument {
		t.Errorf("ResolveProtocol(slot holder) error = %v; want INVALID_ARGUMENT for its hash mismatch", err)
	}
	// The busy source was not put in the negative cache: once free, it is
	// fetched (and fails its hash check, as it serves other bytes).
	resp = do(t, "POST", r.url+"/v1/protocols:resolve", body)
	if resp.code != http.StatusBadRequest || !bytes.Contains(resp.body, []byte("content has SHA-1")) {
		t.Errorf("POST /v1/protocols:resolve after release = %d %s; want 400 for the hash mismatch", resp.code, resp.body)
	}
}

func TestPeriodicPeerSync(t *testing.T) {
	ctx := t.Context()
	a := startRegistry(t)
	b := startRegistry(t, "--registry-peers", a.grpc, "--registry-peer-sync-interval", "20ms")
	// waitFor polls b until it stores every document a stores.
	waitFor := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			list, err := b.client.ListProtocols(ctx, &registryv1.ListProtocolsRequest{})
			if err == nil && len(list.GetProtocols()) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the syncing registry lists %d protocols (err %v), want %d", len(list.GetProtocols()), err, want)
			}
			time.Sleep(5 * time.Millisecond) // between polls, not a wait for the result
		}
	}
	for i := range 2 {
		if _, err := a.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(fmt.Sprintf("synced %d", i))}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(2)
	if _, err := a.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte("synced later")}}); err != nil {
		t.Fatal(err)
	}
	waitFor(3)
	// Close stops the loop: it returns (waiting for the loop) even while
	// the peer is down.
	a.cleanup()
	b.cleanup()
}

// TestResolveSchemaRefReadsNoFile: a PD fetched from a data: URI whose
// requestSchema refers to a local file is refused as invalid metadata, and
// the file's bytes appear nowhere in the answer.
func TestResolveSchemaRefReadsNoFile(t *testing.T) {
	const secret = "TOP-SECRET-BYTES"
	path := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(path, []byte(`{"type": "`+secret+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startRegistry(t)
	doc := "---\nname: Refs\nrequestSchema:\n  $ref: \"file://" + path + "\"\n---\nText."
	_, err := r.client.ResolveProtocol(t.Context(), &registryv1.ResolveProtocolRequest{
		Hash:    fmt.Sprintf("%x", sha1Sum(doc)),
		Sources: []string{"data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(doc))},
	})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "outside the schema") {
		t.Errorf("ResolveProtocol(PD with a file: $ref) error = %v; want INVALID_ARGUMENT refusing the ref", err)
	}
	if strings.Contains(fmt.Sprint(status.Convert(err).Proto()), secret) {
		t.Errorf("ResolveProtocol(PD with a file: $ref) leaks the file: %v", err)
	}
}

// TestResolveErrorsRevealNoAddresses: a caller learns which of its sources
// failed and in which way, never what the registry's DNS resolved a name to
// nor which resolver it asked.
func TestResolveErrorsRevealNoAddresses(t *testing.T) {
	r := startRegistry(t)
	victim := listen(t)
	t.Cleanup(func() { victim.Close() })
	_, port, _ := net.SplitHostPort(victim.Addr().String())
	sources := []string{"https://localhost:" + port + "/pd", "https://parley-no-such-host.invalid/pd"}
	_, err := r.client.ResolveProtocol(t.Context(), &registryv1.ResolveProtocolRequest{Hash: strings.Repeat("ab", 20), Sources: sources})
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("ResolveProtocol(localhost, unresolvable) error = %v; want INVALID_ARGUMENT", err)
	}
	all := fmt.Sprint(st.Proto()) // message and details
	for _, want := range []string{`sources[0] "` + sources[0] + `": destination refused`, `sources[1] "` + sources[1] + `": could not be reached or read: source unavailable`} {
		if !strings.Contains(st.Message(), want) {
			t.Errorf("message %q lacks %q", st.Message(), want)
		}
	}
	for _, leak := range []string{"127.0.0.1", "::1", ":53", "lookup", "loopback"} {
		if strings.Contains(all, leak) {
			t.Errorf("error reveals %q: %s", leak, all)
		}
	}
}

// silentListener accepts connections and never answers.
func silentListener(t *testing.T) net.Listener {
	t.Helper()
	ln := listen(t)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	return ln
}

// TestResolveThreeSilentSourcesShareOneBudget: --pd-fetch-timeout bounds a
// whole resolution, not each source, so that the registry answers well
// within the dispatcher's own time limit.
func TestResolveThreeSilentSourcesShareOneBudget(t *testing.T) {
	silent := silentListener(t)
	const budget = 100 * time.Millisecond
	r := startRegistry(t, "--pd-fetch-allow-http", "--pd-fetch-allow", silent.Addr().String(), "--pd-fetch-timeout", budget.String())
	base := "http://" + silent.Addr().String()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a backstop: a lost budget fails, not hangs
	defer cancel()
	start := time.Now()
	_, err := r.client.ResolveProtocol(ctx, &registryv1.ResolveProtocolRequest{Hash: strings.Repeat("ef", 20), Sources: []string{base + "/a", base + "/b", base + "/c"}})
	elapsed := time.Since(start)
	// The proof that the sources share one budget is the message: with a
	// budget each, the last source would have been tried and timed out
	// too, not left "not tried".
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.NotFound || !strings.Contains(msg, `sources[0] "`+base+`/a": timed out`) || !strings.Contains(msg, `sources[2] "`+base+`/c": not tried`) {
		t.Errorf("ResolveProtocol(three silent sources) error = %v; want NOT_FOUND, the first timed out, the last not tried", err)
	}
	if elapsed > fetchBudgetBound {
		t.Errorf("ResolveProtocol(three silent sources) took %v; want the %v budget to end it (bound %v)", elapsed, budget, fetchBudgetBound)
	}
}

// recordingHandler keeps every log record at Warn and above.
type recordingHandler struct {
	mu      sync.Mutex
	records []string
}

func (h *recordingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Level.String()+" "+r.Message)
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordingHandler) errors() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.records {
		if strings.HasPrefix(r, "ERROR") {
			out = append(out, r)
		}
	}
	return out
}

// TestCloseDuringResolution: Close ends a shared resolution that is still
// waiting for its source, returns promptly, and the resolution does not
// then write to the closed store (which would be logged as an internal
// error).
func TestCloseDuringResolution(t *testing.T) {
	doc := "---\nname: Late\n---\nArrives after Close."
	hit := make(chan struct{}, 1)
	release := make(chan struct{})
	src := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hit <- struct{}{}
		<-release
		_, _ = io.WriteString(w, doc)
	})}
	srcLis := listen(t)
	go func() { _ = src.Serve(srcLis) }()
	t.Cleanup(func() { src.Close() })
	var released sync.Once
	t.Cleanup(func() { released.Do(func() { close(release) }) })

	// Only Close can end the resolution: the source answers after Close,
	// and the budget is far longer than any wait below.
	cfg, err := config.Load([]string{"--data", t.TempDir(), "--pd-fetch-allow-http", "--pd-fetch-allow", srcLis.Addr().String(), "--pd-fetch-timeout", "1h"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	logs := &recordingHandler{}
	logger := slog.New(logs)
	a, err := app.New(cfg, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := serve.New(serve.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := a.Register(ctx, srv); err != nil {
		t.Fatal(err)
	}
	grpcLis := listen(t)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, grpcLis, listen(t)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() error = %v", err)
		}
	})
	conn, err := grpc.NewClient(grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := registryv1.NewRegistryServiceClient(conn)

	resolved := make(chan error, 1)
	go func() {
		_, err := client.ResolveProtocol(ctx, &registryv1.ResolveProtocolRequest{Hash: fmt.Sprintf("%x", sha1Sum(doc)), Sources: []string{"http://" + srcLis.Addr().String() + "/pd"}})
		resolved <- err
	}()
	select {
	case <-hit:
	case <-time.After(10 * time.Second):
		t.Fatal("the source was never asked")
	}
	// Close must end the resolution, not wait for it: a Close that waited
	// would return only after the source answers (below) or the 1h
	// budget. The wait is a margin for a loaded CI machine, not a speed.
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close() error = %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close() did not return within a minute while the source held its answer; want it to end the resolution")
	}
	released.Do(func() { close(release) }) // the source answers only now
	select {
	case err := <-resolved:
		if status.Code(err) != codes.Unavailable {
			t.Errorf("ResolveProtocol() cut short by Close: error = %v; want UNAVAILABLE", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ResolveProtocol() did not return after Close")
	}
	if errs := logs.errors(); len(errs) != 0 {
		t.Errorf("Close during a resolution logged errors: %q", errs)
	}
}

// TestConditionalGetOfMissingDocument: If-None-Match never turns a missing
// document into 304; a stored one with a matching tag is 304.
func TestConditionalGetOfMissingDocument(t *testing.T) {
	r := startRegistry(t)
	if _, err := r.client.CreateProtocol(t.Context(), &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(weatherPD)}}); err != nil {
		t.Fatal(err)
	}
	missing := strings.Repeat("ab", 20)
	for _, tt := range []struct {
		hash, ifNoneMatch string
		want              int
	}{
		{missing, "*", 404},
		{missing, `"` + missing + `"`, 404},
		{weatherHex, "*", 304},
		{weatherHex, `W/"` + weatherHex + `"`, 304},
		{weatherHex, `"other"`, 200},
	} {
		if got := do(t, "GET", r.url+"/protocols/"+tt.hash, "", "If-None-Match", tt.ifNoneMatch); got.code != tt.want {
			t.Errorf("GET /protocols/%s with If-None-Match %s = %d, want %d", tt.hash, tt.ifNoneMatch, got.code, tt.want)
		}
	}
}

// TestDiscoveryIgnoresForgedHost: without --public-url, a Host header that
// is not a loopback host does not end up in advertised sources; the
// listener's address does. A loopback Host (local demos) is kept.
func TestDiscoveryIgnoresForgedHost(t *testing.T) {
	r := startRegistry(t)
	ctx := t.Context()
	if _, err := r.client.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "w", Agent: &registryv1.Agent{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(weatherPD)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.AddSupportedProtocol(ctx, &registryv1.AddSupportedProtocolRequest{Name: "clients/acme/agents/w", Protocol: weatherHex}); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(r.url, "http://"))
	for _, tt := range []struct {
		host, wantBase string
	}{
		{"evil.example", r.url},
		{"evil.example:" + port, r.url},
		{"10.1.2.3:" + port, r.url},
		{"localhost:" + port, "http://localhost:" + port},
		{"[::1]:" + port, "http://[::1]:" + port},
	} {
		req, err := http.NewRequestWithContext(ctx, "GET", r.url+"/agora/acme/w/.wellknown", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = tt.host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var shape map[string][]string
		err = json.NewDecoder(resp.Body).Decode(&shape)
		resp.Body.Close()
		want := tt.wantBase + "/protocols/" + weatherHex
		if err != nil || len(shape[weatherHex]) != 1 || shape[weatherHex][0] != want {
			t.Errorf("wellknown with Host %s = %v, %v; want [%s]", tt.host, shape, err, want)
		}
	}
}

// TestKeys_grpcThenREST creates an agent over gRPC, then manages its keys
// over REST, through both bindings of the key routes.
func TestKeys_grpcThenREST(t *testing.T) {
	r := startRegistry(t)
	a, err := r.client.CreateAgent(t.Context(), &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", Agent: &registryv1.Agent{Owner: &registryv1.Owner{Country: "FR"}}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(r.url+"/v1/"+a.GetName()+"/keys", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	var created struct{ Name, Secret string }
	err = json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !strings.HasPrefix(created.Secret, "parley_ak_") {
		t.Fatalf("POST /v1/%s/keys = %d %+v, %v; want 200 with a secret", a.GetName(), resp.StatusCode, created, err)
	}
	resp, err = http.Get(r.url + "/v1/" + a.GetName() + "/keys")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.Contains(string(body), "parley_ak_") || !strings.Contains(string(body), created.Name) {
		t.Errorf("GET keys = %d %s; want both keys listed without secrets", resp.StatusCode, body)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodDelete, r.url+"/v1/"+created.Name, nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("DELETE /v1/%s = %d, want 200", created.Name, resp.StatusCode)
	}
	got, err := r.client.IntrospectKey(t.Context(), &registryv1.IntrospectKeyRequest{Secret: created.Secret})
	if err != nil || got.GetActive() {
		t.Errorf("IntrospectKey(revoked over REST) = %v, %v; want inactive", got, err)
	}
	got, err = r.client.IntrospectKey(t.Context(), &registryv1.IntrospectKeyRequest{Secret: a.GetInitialKey().GetSecret()})
	if err != nil || !got.GetActive() || got.GetAgent() != a.GetName() {
		t.Errorf("IntrospectKey(initial key) = %v, %v; want active for %s", got, err, a.GetName())
	}
	// Access control is not switched on here, so there is no principal and
	// no check: CreateClient works as every other call does.
	if c, err := r.client.CreateClient(t.Context(), &registryv1.CreateClientRequest{ClientId: "acme"}); err != nil || !strings.HasPrefix(c.GetKey().GetSecret(), "parley_ck_") {
		t.Errorf("CreateClient(access control off) = %v, %v; want the client and its key", c, err)
	}
	open := startRegistry(t, "--open-registration")
	if c, err := open.client.CreateClient(t.Context(), &registryv1.CreateClientRequest{ClientId: "acme"}); err != nil || !strings.HasPrefix(c.GetKey().GetSecret(), "parley_ck_") {
		t.Errorf("CreateClient(open registration) = %v, %v", c, err)
	}
}
