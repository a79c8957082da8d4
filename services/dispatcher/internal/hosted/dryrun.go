package hosted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

// Case is one call of a dry run.
type Case struct {
	Fn   string
	Args []json.RawMessage
}

// Result is one case's outcome: Output, or Err (the routine's failure) with
// Budget set when a budget stopped it and Kind the failure's kind.
type Result struct {
	Output json.RawMessage
	Err    string
	Budget bool
	Kind   dispatcherv1.RoutineFailureKind
}

// DryRun compiles src with tools and runs each case in the production
// runtime, with the same budgets and worker pool as hosted routines. It
// stores nothing and reads no agent state. It returns the functions src
// defines and one result per case; errors wrap ErrInvalid (src does not
// compile or load) or are routine.ErrBusy.
func (s *Set) DryRun(ctx context.Context, src string, tools map[string]routine.Tool, cases []Case) ([]string, []Result, error) {
	prog, err := routine.Compile(ctx, "test", src, tools, s.opts.Limits)
	if errors.Is(err, routine.ErrBusy) {
		return nil, nil, err
	}
	if err != nil {
		CountStop(s.opts.Metrics, err)
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	results := make([]Result, 0, len(cases))
	for _, c := range cases {
		if !prog.Has(c.Fn) {
			results = append(results, Result{Err: "the routine defines no function " + c.Fn})
			continue
		}
		out, _, err := prog.Call(ctx, c.Fn, c.Args, nil)
		switch {
		case errors.Is(err, routine.ErrBusy):
			return nil, nil, err
		case err != nil:
			CountStop(s.opts.Metrics, err)
			results = append(results, Result{Err: err.Error(), Budget: errors.Is(err, routine.ErrBudget), Kind: FailureKind(err)})
		default:
			results = append(results, Result{Output: out})
		}
	}
	return prog.Functions(), results, nil
}
