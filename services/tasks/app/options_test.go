package app

import (
	"reflect"
	"testing"

	"github.com/parleyhq/parley/platform/envflag/envflagtest"
	"github.com/parleyhq/parley/services/tasks/config"
)

// The config owns every default and the app copies it verbatim: with the
// default flags, every limit of server.Options and rest.Options is the
// flag's value, and none is left zero for New to fill in (New fills in none).
func TestOptions_defaultConfigReachesOptionsUnchanged(t *testing.T) {
	cfg, err := config.Load([]string{"--data", t.TempDir()}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	opts, rest := serverOptions(cfg), restOptions(cfg)
	got := map[string]any{
		"StepWait":        opts.StepWait,
		"StepTimeout":     opts.StepTimeout,
		"RetryMax":        opts.RetryMax,
		"MaxPageSize":     opts.MaxPageSize,
		"MaxUploadBytes":  opts.MaxUploadBytes,
		"MaxWatchers":     opts.MaxWatchers,
		"MaxInFlight":     opts.MaxInFlight,
		"MaxWaitingSteps": opts.MaxWaitingSteps,
		"MaxStepAttempts": opts.MaxStepAttempts,
	}
	c := reflect.ValueOf(cfg)
	for field, v := range got {
		if want := c.FieldByName(field).Interface(); !reflect.DeepEqual(v, want) {
			t.Errorf("%s: Options has %v, config %v", field, v, want)
		}
	}
	if rest.MaxPageSize != cfg.MaxPageSize || rest.MaxUploadBytes != cfg.MaxUploadBytes {
		t.Errorf("rest.Options %+v, config MaxPageSize %d MaxUploadBytes %d", rest, cfg.MaxPageSize, cfg.MaxUploadBytes)
	}
	// A limit added to server.Options without a flag would stay zero here.
	envflagtest.NonZeroLimits(t, "server.Options", opts)
}
