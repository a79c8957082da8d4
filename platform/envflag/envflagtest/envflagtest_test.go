package envflagtest

import (
	"testing"
	"time"
)

// recorder counts Errorf calls instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) { r.errs = append(r.errs, format) }

func TestNonZeroLimits(t *testing.T) {
	type inner struct{ Queue int }
	type opts struct {
		Timeout time.Duration
		Max     int
		Name    string // not a limit: ignored
		Inner   inner
	}
	for _, tc := range []struct {
		name             string
		opts             opts
		wantTop, wantAll int
	}{
		{"all set", opts{Timeout: time.Second, Max: 1, Inner: inner{Queue: 1}}, 0, 0},
		{"zero duration and nested", opts{Max: 1}, 1, 2},
		{"all zero", opts{}, 2, 3},
	} {
		top, all := &recorder{TB: t}, &recorder{TB: t}
		NonZeroLimits(top, "Options", tc.opts)
		NonZeroLimitsNested(all, "Options", tc.opts)
		if len(top.errs) != tc.wantTop || len(all.errs) != tc.wantAll {
			t.Errorf("%s: %d and %d failures, want %d and %d", tc.name, len(top.errs), len(all.errs), tc.wantTop, tc.wantAll)
		}
	}
}
