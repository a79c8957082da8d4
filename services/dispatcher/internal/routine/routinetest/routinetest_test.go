package routinetest

import (
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

func TestLimits_fillsOnlyTheZeroBudgets(t *testing.T) {
	l := Limits(routine.Limits{Timeout: time.Minute})
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	if l.Timeout != time.Minute {
		t.Errorf("Timeout = %v, want the caller's 1m kept", l.Timeout)
	}
}
