package app_test

import (
	"io"
	"net/http"
	"strconv"
	"testing"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// BenchmarkGetProtocolRaw compares GET /protocols/{hash} through the real
// serve.Server handler (telemetry middleware, mux, registry route, cache)
// with a bare net/http handler writing the same bytes and headers, both over
// loopback HTTP/1.1 keep-alive, one request at a time. Compare ns/op of the
// two sub-benchmarks of one run.
func BenchmarkGetProtocolRaw(b *testing.B) {
	r := startRegistry(b)
	p, err := r.client.CreateProtocol(b.Context(), &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(weatherPD)}})
	if err != nil {
		b.Fatal(err)
	}
	content := []byte(weatherPD)
	etag := `"` + p.GetSha1Hex() + `"`
	bare := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h["Content-Type"] = []string{"text/plain; charset=utf-8"}
		h["Etag"] = []string{etag}
		h["Content-Length"] = []string{strconv.Itoa(len(content))}
		_, _ = w.Write(content)
	})}
	bareLis := listen(b)
	go func() { _ = bare.Serve(bareLis) }() // ErrServerClosed once cleanup closes it
	b.Cleanup(func() { bare.Close() })

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for _, bc := range []struct{ name, url string }{
		{"serve", r.url + "/protocols/" + p.GetSha1Hex()},
		{"bare", "http://" + bareLis.Addr().String() + "/protocols/" + p.GetSha1Hex()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req, err := http.NewRequest(http.MethodGet, bc.url, nil)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || n != int64(len(content)) {
					b.Fatalf("GET %s = %d, %d bytes", bc.url, resp.StatusCode, n)
				}
			}
		})
	}
}
