package server

import (
	"context"
	"errors"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/services/negotiator/internal/llm"
	"github.com/parleyhq/parley/services/negotiator/internal/store"
)

// GetCostSummary implements NegotiatorService.
func (s *Server) GetCostSummary(ctx context.Context, req *negotiatorv1.GetCostSummaryRequest) (*negotiatorv1.CostSummary, error) {
	var v grpcerr.Violations
	checkAgent(&v, req.GetAgent(), false)
	if err := invalid(v); err != nil {
		return nil, err
	}
	sum, err := s.ledger.Summary(ctx, req.GetAgent())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return sum, nil
}

// ListLedgerEntries implements NegotiatorService.
func (s *Server) ListLedgerEntries(ctx context.Context, req *negotiatorv1.ListLedgerEntriesRequest) (*negotiatorv1.ListLedgerEntriesResponse, error) {
	var v grpcerr.Violations
	checkAgent(&v, req.GetAgent(), false)
	if r := req.GetRole(); r != "" {
		known := false
		for _, role := range llm.Roles {
			known = known || string(role) == r
		}
		if !known {
			v.Add("role", "must be negotiation, programming, checking or conversation")
		}
	}
	size, ok := pagetoken.Size(req.GetPageSize(), 50, 1000)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	after, err := pagetoken.Decode(req.GetPageToken(), req.GetAgent(), req.GetRole())
	if errors.Is(err, pagetoken.ErrInvalid) {
		v.Add("page_token", "is not a token from a previous call with the same filters")
	}
	if err := invalid(v); err != nil {
		return nil, err
	}
	entries, next, err := s.store.ListLedgerEntries(ctx, store.LedgerFilter{Agent: req.GetAgent(), Role: req.GetRole()}, after, size)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &negotiatorv1.ListLedgerEntriesResponse{LedgerEntries: entries}
	if next != "" {
		resp.NextPageToken = pagetoken.Encode(next, req.GetAgent(), req.GetRole())
	}
	return resp, nil
}

// GetThresholds implements NegotiatorService.
func (s *Server) GetThresholds(_ context.Context, req *negotiatorv1.GetThresholdsRequest) (*negotiatorv1.Thresholds, error) {
	t := s.opts.Thresholds.Lookup(req.GetTask(), req.GetTarget())
	return &negotiatorv1.Thresholds{
		LookUpAfter:             int32(t.LookUpAfter),
		NegotiateAfter:          int32(t.NegotiateAfter),
		RequestNegotiationAfter: int32(t.RequestNegotiationAfter),
		RoutineOnUse:            int32(t.RoutineOnUse),
	}, nil
}
