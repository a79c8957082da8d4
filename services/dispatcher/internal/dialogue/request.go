package dialogue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/parleyhq/parley/platform/sweep"
	"github.com/parleyhq/parley/services/dispatcher/internal/fault"
)

// ErrRequestInProgress is returned while a send with the same request_id
// is still running.
var ErrRequestInProgress = errors.New("request in progress")

// requestStale is how long a pending request may run before a repeat takes
// it over: longer than any send's time limit, so only a send whose process
// died is taken over.
const requestStale = 2 * time.Minute

// RequestRetention is how long a request_id is remembered.
const RequestRetention = 24 * time.Hour

// once runs send for a request_id at most once per sender (AIP-155): a
// repeat gets the first result without sending again. A send that failed is
// forgotten, so its repeat runs again. Without an id, send just runs.
func (s *Service) once(ctx context.Context, sender, requestID string, send func() (Result, error)) (Result, error) {
	if requestID == "" {
		return send()
	}
	now := s.opts.Now().UTC()
	rec, found, err := s.store.BeginRequest(ctx, sender, requestID, now, now.Add(-requestStale))
	if err != nil {
		return Result{}, err
	}
	if found {
		if !rec.Done {
			return Result{}, fault.New(ErrRequestInProgress, fmt.Sprintf("a send with request_id %q is still running; repeat it in a moment", requestID))
		}
		var res Result
		if err := json.Unmarshal(rec.Result, &res); err != nil {
			return Result{}, fmt.Errorf("request %q: %w", requestID, err)
		}
		return res, nil
	}
	res, sendErr := send()
	var result json.RawMessage // nil forgets a failed request
	if sendErr == nil {
		if result, err = json.Marshal(res); err != nil {
			return Result{}, err
		}
	}
	// Recorded on a context of its own: the send happened even if the
	// caller is gone.
	finishCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.store.FinishRequest(finishCtx, sender, requestID, result); err != nil {
		s.opts.Logger.WarnContext(ctx, "request_id not recorded; a repeat will send again", slog.String("agent", sender), slog.Any("err", err))
	}
	return res, sendErr
}

// SweepRequests forgets request_ids older than RequestRetention, in
// transactions of at most sweep.Batch, and returns how many.
func (s *Service) SweepRequests(ctx context.Context) (int, error) {
	return sweep.InBatches(ctx, s.opts.Now().Add(-RequestRetention), s.store.SweepRequests)
}
