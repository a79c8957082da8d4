package app

import (
	"reflect"
	"testing"

	"github.com/parleyhq/parley/platform/envflag/envflagtest"
	"github.com/parleyhq/parley/services/dispatcher/config"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine/routinetest"
)

// The config owns every default and the app copies it verbatim: with the
// default flags, every limit of server.Options is the flag's value, and
// none is left zero for New to fill in (New fills in none).
func TestOptions_defaultConfigReachesOptionsUnchanged(t *testing.T) {
	cfg, err := config.Load([]string{"--data", t.TempDir()}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	opts, err := (&App{cfg: cfg}).options()
	if err != nil {
		t.Fatal(err)
	}
	pool := routine.NewPoolWith(poolOptions(cfg)).Options()
	got := map[string]any{
		"ConversationTTL":           opts.ConversationTTL,
		"MaxConversationsPerPeer":   opts.MaxConversationsPerPeer,
		"PaymentMaxOpen":            opts.PaymentMaxOpen,
		"PaymentRetention":          opts.PaymentRetention,
		"RoutineMaxSteps":           opts.RoutineLimits.MaxSteps,
		"RoutineTimeout":            opts.RoutineLimits.Timeout,
		"RoutineMaxOutputBytes":     opts.RoutineLimits.MaxOutputBytes,
		"RoutineMaxToolCalls":       opts.RoutineLimits.MaxToolCalls,
		"RoutineMaxAllocBytes":      opts.RoutineLimits.MaxAllocBytes,
		"QuarantineAfter":           opts.QuarantineAfter,
		"HandlerTimeout":            opts.HandlerTimeout,
		"HandlerQueue":              opts.HandlerQueue,
		"CacheTTL":                  opts.CacheTTL,
		"NegativeCacheTTL":          opts.NegativeCacheTTL,
		"SendTimeout":               opts.SendTimeout,
		"SendRetries":               opts.SendRetries,
		"SendMaxListed":             opts.SendMaxListed,
		"SendMaxJudgeCalls":         opts.SendMaxJudge,
		"MessageMaxBodyBytes":       opts.MessageMaxBodyBytes,
		"MessageTimeout":            opts.MessageTimeout,
		"MailboxStreamBatch":        opts.MailboxOptions.Batch,
		"MailboxStreamKeepalive":    opts.MailboxOptions.Keepalive,
		"MailboxStreamMaxDuration":  opts.MailboxOptions.MaxDuration,
		"MailboxStreamWriteTimeout": opts.MailboxOptions.WriteTimeout,
		"AgoraMaxBodyBytes":         httpOptions(cfg).MaxBodyBytes,
		"RoutineWorkers":            pool.Workers,
		"RoutineMemoryBytes":        pool.MemoryBytes,
		"RoutineKillMargin":         pool.KillMargin,
		"RoutineWorkerCPU":          pool.WorkerCPU,
	}
	c := reflect.ValueOf(cfg)
	for field, v := range got {
		want := c.FieldByName(field)
		if !want.IsValid() {
			t.Fatalf("config has no field %s", field)
		}
		if !reflect.DeepEqual(v, want.Interface()) {
			t.Errorf("%s: Options has %v, config %v", field, v, want.Interface())
		}
	}
	// routine.Compile fills in no budget: the config's must all be set,
	// and the core's tests assume the same values.
	if err := opts.RoutineLimits.Validate(); err != nil {
		t.Error(err)
	}
	budgets := opts.RoutineLimits
	budgets.Pool = nil
	if want := routinetest.Limits(routine.Limits{}); budgets != want {
		t.Errorf("routine budgets %+v, routinetest.Limits %+v: the core's tests assume other defaults", budgets, want)
	}
	// A limit added to Options without a flag would stay zero here.
	envflagtest.NonZeroLimitsNested(t, "Options", opts)
	envflagtest.NonZeroLimitsNested(t, "PoolOptions", pool)
}
