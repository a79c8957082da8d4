package server

import (
	"log/slog"
	"testing"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/store/boltstore"
)

const benchPD = "---\nname: Weather Forecast Query Protocol\ndescription: Query the weather forecast for a given date and location.\nmultiround: false\n---\n\nThe sender sends a JSON object {\"date\": \"YYYY-MM-DD\", \"location\": string}."

// BenchmarkResolveStored measures ResolveProtocol for a stored hash, the
// dispatcher's per-envelope call, in-process (no transport).
func BenchmarkResolveStored(b *testing.B) {
	for _, bc := range []struct {
		name       string
		cacheBytes int64
		hash       func(*registryv1.Protocol) string
	}{
		{"cache/hex", 64 << 20, (*registryv1.Protocol).GetSha1Hex},
		{"cache/base64", 64 << 20, (*registryv1.Protocol).GetSha1Base64},
		{"nocache/hex", 0, (*registryv1.Protocol).GetSha1Hex},
	} {
		b.Run(bc.name, func(b *testing.B) {
			st, err := boltstore.Open(b.TempDir(), time.Second)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.Close() })
			s := New(st, slog.New(slog.DiscardHandler), testOptions(Options{CacheBytes: bc.cacheBytes}))
			p, err := s.CreateProtocol(b.Context(), &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(benchPD)}})
			if err != nil {
				b.Fatal(err)
			}
			req := &registryv1.ResolveProtocolRequest{Hash: bc.hash(p), Sources: []string{"https://example.com/pd"}}
			ctx := b.Context()
			for b.Loop() {
				if _, err := s.ResolveProtocol(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
