package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// BenchmarkEnvelope compares an envelope answered by the weather routine
// through the Agora HTTP route (fake registry, warm caches) with a bare
// net/http JSON echo, over real loopback HTTP, at 16 and 64 concurrent
// requests. Compare ns/op of the pairs; p50 and p99 are reported too.
//
//	go test -run '^$' -bench Envelope -benchtime 20000x ./internal/server
func BenchmarkEnvelope(b *testing.B) {
	body := []byte(`{"protocolHash":"` + weatherHex + `","protocolSources":null,"body":"{\"date\": \"2026-12-01\", \"location\": \"Paris\"}"}`)
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v map[string]any
		if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "body": v["body"]})
	}))
	defer echo.Close()
	e := benchEnv(b)
	for _, c := range []int{16, 64} {
		b.Run(fmt.Sprintf("echo/c%d", c), func(b *testing.B) { drive(b, echo.URL, body, c) })
		b.Run(fmt.Sprintf("routine/c%d", c), func(b *testing.B) { drive(b, e.url+"/agora/acme/weather", body, c) })
	}
}

// BenchmarkEnvelopeHandler is the dispatcher's own cost per routine-answered
// envelope: the Agora handler called in memory, no sockets, so -cpuprofile
// and -benchmem show the hot path alone.
//
//	go test -run '^$' -bench EnvelopeHandler -benchmem -cpuprofile cpu.out ./internal/server
func BenchmarkEnvelopeHandler(b *testing.B) {
	body := []byte(`{"protocolHash":"` + weatherHex + `","protocolSources":null,"body":"{\"date\": \"2026-12-01\", \"location\": \"Paris\"}"}`)
	e := benchEnv(b)
	mux := http.NewServeMux()
	for p, h := range AgoraRoutes(e.srv, testHTTPOptions) {
		mux.Handle(p, h)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest("POST", "/agora/acme/weather", bytes.NewReader(body))
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, req)
			if rec.Code != 200 || !bytes.Contains(rec.Body.Bytes(), []byte(`"success"`)) {
				b.Errorf("reply %d %s", rec.Code, rec.Body)
				return
			}
		}
	})
}

func benchEnv(b *testing.B) *testEnv {
	b.Helper()
	reg := newFakeRegistry()
	reg.addProtocol(weatherPD)
	reg.addAgent(agentRes(weatherAgent, registryv1.Dialect_DIALECT_UNSPECIFIED, 0, weatherHex))
	e := startEnv(b, reg, "", Options{Now: time.Now})
	e.setTable(weatherAgent, "weather", weatherTable)
	e.setRoutine(weatherAgent, weatherHex, weatherRoutine)
	return e
}

func drive(b *testing.B, url string, body []byte, concurrency int) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency, MaxConnsPerHost: concurrency}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	lat := make([]time.Duration, 0, b.N)
	b.SetParallelism((concurrency + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		local := make([]time.Duration, 0, 1024)
		for pb.Next() {
			start := time.Now()
			resp, err := client.Post(url, "application/json", bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !bytes.Contains(out, []byte(`"success"`)) {
				b.Errorf("reply %d %s", resp.StatusCode, out)
				return
			}
			local = append(local, time.Since(start))
		}
		mu.Lock()
		lat = append(lat, local...)
		mu.Unlock()
	})
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkIdleConversation measures what an idle conversation costs: bytes
// of bbolt file and of Go heap per conversation, with a small routine
// memory.
func BenchmarkIdleConversation(b *testing.B) {
	e := benchEnv(b)
	st := e.srv.store
	now := time.Now()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	sizeBefore := fileSize(e.dataDir)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		c := store.Conversation{
			ID: fmt.Sprintf("conv-%022d", i), Agent: counterAgent, Peer: fmt.Sprintf("10.0.%d.%d", i/250%250, i%250),
			ProtocolHash: weatherHex, Memory: json.RawMessage(`{"n":3,"last":{"q":"next"}}`),
			CreateTime: now, ExpireTime: now.Add(5 * time.Minute),
		}
		if err := st.CreateConversation(b.Context(), c, 100, now); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(fileSize(e.dataDir)-sizeBefore)/float64(b.N), "disk-B/conv")
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "heap-B/conv")
}
