package app

import (
	"reflect"
	"testing"

	"github.com/parleyhq/parley/platform/envflag/envflagtest"
	"github.com/parleyhq/parley/services/negotiator/config"
	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
)

// The config owns every default and the app copies it verbatim: with the
// default flags, every limit of the server's and the LLM client's options
// is the flag's value, and none is left zero for New to fill in (server.New
// and llm.NewClient fill in none).
func TestOptions_defaultConfigReachesOptionsUnchanged(t *testing.T) {
	cfg, err := config.Load([]string{"--data", t.TempDir()}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	srv, lo := serverOptions(cfg, negotiation.ThresholdTable{}), llmOptions(cfg.LLM)
	got := map[string][2]any{
		"MaxRounds":     {srv.MaxRounds, cfg.NegotiationMaxRounds},
		"ShadowCalls":   {srv.ShadowCalls, cfg.RoutineShadowCalls},
		"Timeout":       {lo.Timeout, cfg.LLM.Timeout},
		"MaxRetries":    {lo.MaxRetries, cfg.LLM.MaxRetries},
		"BaseBackoff":   {lo.BaseBackoff, cfg.LLM.BaseBackoff},
		"MaxBackoff":    {lo.MaxBackoff, cfg.LLM.MaxBackoff},
		"MaxConcurrent": {lo.MaxConcurrent, cfg.LLM.MaxConcurrent},
	}
	for field, v := range got {
		if !reflect.DeepEqual(v[0], v[1]) {
			t.Errorf("%s: Options has %v, config %v", field, v[0], v[1])
		}
	}
	// A limit added to Options without a flag would stay zero here.
	envflagtest.NonZeroLimits(t, "server.Options", srv)
	envflagtest.NonZeroLimits(t, "llm.Options", lo)
}
