// Package server implements parley.negotiator.v1.NegotiatorService.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/services/negotiator/internal/ledger"
	"github.com/parleyhq/parley/services/negotiator/internal/llm"
	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
	"github.com/parleyhq/parley/services/negotiator/internal/store"
)

// Domain is the ErrorInfo domain of the negotiator's errors.
const Domain = "negotiator.parley.dev"

// Options are the server's optional settings.
type Options struct {
	// MaxRounds caps the messages of one negotiation; it must be at least
	// 2 (config owns the default).
	MaxRounds int
	// ShadowCalls is how many agreeing shadow calls promote an LLM-written
	// routine; zero promotes at once (config owns the default).
	ShadowCalls int
	// Thresholds are the per-(task, target) thresholds.
	Thresholds negotiation.ThresholdTable
	// Now and NewID are test seams.
	Now   func() time.Time
	NewID func() string
}

// Server implements the negotiator's gRPC API.
type Server struct {
	negotiatorv1.UnimplementedNegotiatorServiceServer

	logger *slog.Logger
	store  store.Store
	ledger *ledger.Ledger
	opts   Options
}

var _ negotiatorv1.NegotiatorServiceServer = (*Server)(nil)

// New returns a Server over st, calling LLMs through led.
func New(st store.Store, led *ledger.Ledger, logger *slog.Logger, opts Options) *Server {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.NewID == nil {
		opts.NewID = randomID
	}
	return &Server{logger: logger, store: st, ledger: led, opts: opts}
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// complete makes one metered LLM call. Provider failures become
// errLLMUnavailable; not configured, budget and context errors pass as is.
func (s *Server) complete(ctx context.Context, agent, peer, op string, req llm.Request) (llm.Response, error) {
	resp, err := s.ledger.Complete(ctx, ledger.Call{Agent: agent, Peer: peer, Operation: op}, req)
	switch {
	case err == nil:
		return resp, nil
	case resp.Model != "":
		// Answered, but the ledger write failed: the caller gets its answer.
		s.logger.ErrorContext(ctx, "llm call not recorded in the ledger", slog.Any("err", err), slog.String("agent", agent))
		return resp, nil
	case errors.Is(err, llm.ErrNotConfigured), errors.Is(err, ledger.ErrBudgetExhausted),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return resp, err
	default:
		return resp, fmt.Errorf("%w: %w", errLLMUnavailable, err)
	}
}
