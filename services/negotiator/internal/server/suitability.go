package server

import (
	"context"
	"errors"
	"log/slog"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/negotiator/internal/store"
	"github.com/parleyhq/parley/services/negotiator/internal/suitability"
)

// CheckSuitability implements NegotiatorService: cache, then prefilter, then
// an LLM whose answer must be a valid verdict object.
func (s *Server) CheckSuitability(ctx context.Context, req *negotiatorv1.CheckSuitabilityRequest) (*negotiatorv1.SuitabilityVerdict, error) {
	var v grpcerr.Violations
	checkAgent(&v, req.GetAgent(), true)
	checkPeer(&v, req.GetPeer(), true)
	checkProtocol(&v, req.GetProtocol(), true)
	checkTask(&v, req.GetTask(), false)
	checkTools(&v, "tools", req.GetTools())
	if err := invalid(v); err != nil {
		return nil, err
	}
	in := suitability.Input{Protocol: req.GetProtocol(), Task: taskOf(req.GetTask()), Tools: toolsOf(req.GetTools())}
	key := suitability.CacheKey(in)
	cached, err := s.store.GetVerdict(ctx, key)
	switch {
	case err == nil:
		cached.Source = negotiatorv1.VerdictSource_VERDICT_SOURCE_CACHE
		return cached, nil
	case !errors.Is(err, store.ErrNotFound):
		return nil, s.toStatus(ctx, err)
	}
	if verdict, decided := suitability.Prefilter(in); decided {
		out := &negotiatorv1.SuitabilityVerdict{Fit: verdict.Fit, Reasons: verdict.Reasons, Source: negotiatorv1.VerdictSource_VERDICT_SOURCE_PREFILTER}
		return out, s.toStatus(ctx, s.store.PutVerdict(ctx, key, out))
	}
	resp, err := s.complete(ctx, req.GetAgent(), req.GetPeer(), "CheckSuitability", suitability.Prompt(in))
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	verdict, ok := suitability.ParseVerdict(resp.Text)
	out := &negotiatorv1.SuitabilityVerdict{Fit: verdict.Fit, Reasons: verdict.Reasons, Source: negotiatorv1.VerdictSource_VERDICT_SOURCE_LLM}
	if !ok {
		// Not cached: the next check may get a well-formed answer.
		s.logger.WarnContext(ctx, "suitability checker answered without a valid verdict; counted as not fit", slog.String("agent", req.GetAgent()))
		return out, nil
	}
	return out, s.toStatus(ctx, s.store.PutVerdict(ctx, key, out))
}
