package app

import (
	"log/slog"
	"reflect"
	"testing"

	"github.com/parleyhq/parley/platform/envflag/envflagtest"
	"github.com/parleyhq/parley/services/registry/config"
)

// The config owns every default and the app copies it verbatim: with the
// default flags, every limit of the fetcher's, resolver's and server's
// options is the flag's value, and none is left zero for a New function to
// fill in (they fill in none).
func TestOptions_defaultConfigReachesOptionsUnchanged(t *testing.T) {
	cfg, err := config.Load([]string{"--data", t.TempDir()}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	fo, ro, so := fetchOptions(cfg, slog.New(slog.DiscardHandler)), resolveOptions(cfg), serverOptions(cfg)
	got := map[string][2]any{
		"fetch.MaxBytes":              {fo.MaxBytes, cfg.PDMaxBytes},
		"fetch.ConnectTimeout":        {fo.ConnectTimeout, cfg.FetchConnectTimeout},
		"fetch.Timeout":               {fo.Timeout, cfg.FetchTimeout},
		"fetch.MaxRedirects":          {fo.MaxRedirects, cfg.FetchMaxRedirects},
		"fetch.MaxConcurrent":         {fo.MaxConcurrent, cfg.FetchMaxConcurrent},
		"fetch.MaxPerHost":            {fo.MaxPerHost, cfg.FetchMaxPerHost},
		"resolve.MaxSources":          {ro.MaxSources, cfg.FetchMaxSources},
		"resolve.NegativeTTL":         {ro.NegativeTTL, cfg.FetchNegativeTTL},
		"resolve.NegativeEntries":     {ro.NegativeEntries, cfg.FetchNegativeEntries},
		"resolve.PeerTimeout":         {ro.PeerTimeout, cfg.FetchConnectTimeout},
		"server.MaxBytes":             {so.MaxBytes, cfg.PDMaxBytes},
		"server.CacheBytes":           {so.CacheBytes, cfg.PDCacheBytes},
		"server.ResolveTimeout":       {so.ResolveTimeout, cfg.FetchTimeout},
		"server.RegistrationBurst":    {so.RegistrationBurst, cfg.RegistrationBurst},
		"server.RegistrationInterval": {so.RegistrationInterval, cfg.RegistrationInterval},
	}
	for field, v := range got {
		if !reflect.DeepEqual(v[0], v[1]) {
			t.Errorf("%s: Options has %v, config %v", field, v[0], v[1])
		}
	}
	// A limit added to Options without a flag would stay zero here.
	envflagtest.NonZeroLimits(t, "fetch.Options", fo)
	envflagtest.NonZeroLimits(t, "resolve.Options", ro)
	envflagtest.NonZeroLimits(t, "server.Options", so)
}
