package scheduler

import "time"

// Clock is the scheduler's time: when backoffs end and probes are due.
// Tests inject a fake one to step time instead of sleeping.
type Clock interface {
	Now() time.Time
	// At returns a channel that receives once the time is deadline or
	// later, and a function that stops the timer.
	At(deadline time.Time) (<-chan time.Time, func() bool)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) At(deadline time.Time) (<-chan time.Time, func() bool) {
	t := time.NewTimer(time.Until(deadline))
	return t.C, t.Stop
}
