package inbound

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
	"github.com/parleyhq/parley/services/dispatcher/internal/negotiation"
)

// negotiationState is the receiving side's conversation memory during a
// negotiation.
type negotiationState struct {
	Negotiation string `json:"negotiation"`
	Installed   bool   `json:"installed,omitempty"`
}

// answerNegotiation hands one negotiation message (meta-protocol, or the
// reference library's free text) to the negotiator, with the agent's tools
// and their schemas, and answers with its reply. When the negotiation ends
// accepted, the agreed PD is installed (negotiation.Install).
func (p *Pipeline) answerNegotiation(ctx context.Context, agent *directory.Agent, peer string, body, memIn json.RawMessage) Answer {
	name := agent.Name
	var st negotiationState
	if len(memIn) > 0 {
		_ = json.Unmarshal(memIn, &st)
	}
	if peer == "" {
		peer = "unknown"
	}
	var n negotiation.Negotiation
	var err error
	if st.Negotiation == "" {
		n, err = p.neg.Receive(ctx, "", body, name, peer, p.routines.ToolSpecs(ctx, name))
	} else {
		n, err = p.neg.Receive(ctx, st.Negotiation, body, "", "", nil)
	}
	if err != nil {
		p.opts.Logger.InfoContext(ctx, "negotiation message refused", slog.String("agent", name), slog.Any("err", err))
		a := failed("The negotiation cannot go on: " + negotiation.Failure(err))
		a.Memory = memIn
		return a
	}
	st.Negotiation = n.Name
	if n.State == negotiation.StateAccepted && !st.Installed {
		if err := negotiation.Install(ctx, p.dir, p.routines, p.opts.Logger, name, n, true); err != nil {
			p.opts.Logger.ErrorContext(ctx, "agreed protocol not installed", slog.String("agent", name), slog.String("negotiation", n.Name), slog.Any("err", err))
			a := failed("The protocol was agreed but could not be installed; retry later")
			a.Memory = memIn
			return a
		}
		st.Installed = true
	}
	memory, _ := json.Marshal(st)
	out := n.Outbound
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	return Answer{Body: out, Memory: memory, Path: metrics.PathNegotiation}
}
