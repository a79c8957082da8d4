package routine

import "errors"

// Kind is what stopped a failed run; the server records it on the routine
// and counts it in its metrics.
type Kind uint8

const (
	// KindNone is no failure.
	KindNone Kind = iota
	// KindError is an error raised by the routine, or a result that is not
	// JSON.
	KindError
	// KindTime is the wall-time budget or the request's deadline, whether
	// the run was stopped from inside or its worker was killed.
	KindTime
	// KindMemory is the allocation budget or the worker's memory cap.
	KindMemory
	// KindOutput is a result or memory too large or too deeply nested.
	KindOutput
	// KindSteps is the step budget or the tool-call budget.
	KindSteps
)

// String is the kind's name in metrics and messages.
func (k Kind) String() string {
	switch k {
	case KindError:
		return "error"
	case KindTime:
		return "time"
	case KindMemory:
		return "memory"
	case KindOutput:
		return "output"
	case KindSteps:
		return "steps"
	}
	return "none"
}

// KindOf returns what stopped the run that returned err: KindNone for nil
// and for errors that are not the routine's (a busy pool, a caller gone
// before the run).
func KindOf(err error) Kind {
	if err == nil {
		return KindNone
	}
	var f *failure
	if errors.As(err, &f) {
		return f.kind
	}
	return KindNone
}

// failure is an error of a run, with its kind. It matches ErrBudget for
// every kind but KindError, and ErrTimeBudget for KindTime.
type failure struct {
	kind Kind
	err  error
}

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

func (f *failure) Is(target error) bool {
	switch target {
	case ErrBudget:
		return f.kind != KindError
	case ErrTimeBudget:
		return f.kind == KindTime
	}
	return false
}

// classify marks a run's error with its kind, from the marks the budgets
// left on it.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var f *failure
	switch {
	case errors.As(err, &f):
		return err
	case errors.Is(err, ErrBusy):
		return err // the pool's, not the run's
	case errors.Is(err, ErrTimeBudget):
		return &failure{kind: KindTime, err: err}
	case errors.Is(err, ErrBudget):
		return &failure{kind: KindSteps, err: err}
	}
	return &failure{kind: KindError, err: err}
}
