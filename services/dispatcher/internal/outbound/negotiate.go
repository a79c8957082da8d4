package outbound

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/negotiation"
)

// negotiationRetryAfter is how long a failed negotiation for a (agent,
// task, target) is not retried; Sends meanwhile go out in natural language.
const negotiationRetryAfter = 10 * time.Minute

// negotiationBackoff remembers failed negotiations so a Send does not
// renegotiate on every call.
type negotiationBackoff struct {
	mu    sync.Mutex
	until map[string]time.Time
}

func (b *negotiationBackoff) blocked(key string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.until[key]
	return ok && now.Before(t)
}

func (b *negotiationBackoff) fail(key string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.until == nil || len(b.until) > 10_000 {
		b.until = map[string]time.Time{}
	}
	b.until[key] = until
}

// maybeNegotiate runs a negotiation with the target when the thresholds say
// so, and returns the agreed PD's hash ("" to go on without one) and the
// negotiation's name. With input and output schemas it negotiates at first
// contact: the deterministic path costs no LLM call. Without, it negotiates
// through the LLMs once the agent has sent the task to the target
// negotiate_after times.
func (s *Sender) maybeNegotiate(ctx context.Context, agent, base string, req Request, picked string) (string, string) {
	if s.neg == nil {
		return "", ""
	}
	task := negotiation.Task{Name: req.Task, Description: req.TaskDescription, InputSchema: req.InputSchema, OutputSchema: req.OutputSchema}
	schemas := len(task.InputSchema) > 0 && len(task.OutputSchema) > 0
	key := agent + "\x00" + req.Task + "\x00" + base
	if s.backoff.blocked(key, s.opts.Now()) {
		return "", ""
	}
	if !schemas {
		if picked != "" {
			return "", "" // a PD fits; the LLM speaks it
		}
		after, err := s.neg.NegotiateAfter(ctx, req.Task, base)
		if err != nil {
			return "", ""
		}
		if s.sendCount(ctx, agent, req.Task, base)+1 < int64(after) {
			return "", ""
		}
	}
	n, err := s.negotiate(ctx, agent, base, req.Dialect, task)
	if err != nil || n.State != negotiation.StateAccepted {
		reason := n.FailureReason
		if err != nil {
			reason = err.Error()
		}
		s.opts.Logger.InfoContext(ctx, "negotiation did not agree; sending without a negotiated protocol",
			slog.String("agent", agent), slog.String("target", base), slog.String("task", req.Task), slog.String("reason", reason))
		s.backoff.fail(key, s.opts.Now().Add(negotiationRetryAfter))
		s.opts.Metrics.Negotiations.WithLabelValues("failed").Inc()
		return "", n.Name
	}
	if err := negotiation.Install(ctx, s.dir, s.routines, s.opts.Logger, agent, n, false); err != nil {
		s.opts.Logger.ErrorContext(ctx, "agreed protocol not installed", slog.String("agent", agent), slog.Any("err", err))
		s.opts.Metrics.Negotiations.WithLabelValues("failed").Inc()
		return "", n.Name
	}
	s.wellknown.Forget(base)
	s.opts.Metrics.Negotiations.WithLabelValues("accepted").Inc()
	return n.ProtocolHash, n.Name
}

func (s *Sender) sendCount(ctx context.Context, agent, task, base string) int64 {
	list, err := s.store.ListSendCounts(ctx, agent)
	if err != nil {
		return 0
	}
	for _, c := range list {
		if c.Task == task && c.TargetURL == base {
			return c.Conversations
		}
	}
	return 0
}

// negotiate runs the sending side of a negotiation: the negotiator writes
// each message, which goes to the target under the negotiation PD as a
// multiround Agora conversation, and the target's answers go back to the
// negotiator, until it is no longer our turn. The conversation is ended
// with DELETE.
func (s *Sender) negotiate(ctx context.Context, agent, base string, d agora.Dialect, task negotiation.Task) (negotiation.Negotiation, error) {
	pd, err := s.negotiationPD(ctx)
	if err != nil {
		return negotiation.Negotiation{}, err
	}
	n, err := s.neg.Start(ctx, agent, base, task)
	if err != nil {
		return negotiation.Negotiation{}, errors.New(negotiation.Failure(err))
	}
	target := base
	defer func() {
		if target != base {
			s.endRemoteConversation(ctx, target)
		}
	}()
	for n.State == negotiation.StateOpen && len(n.Outbound) > 0 {
		rep, err := s.postTo(ctx, target, d, negotiation.PDHash, pd, n.Outbound, true)
		if err != nil {
			return n, err
		}
		if rep.conv != "" {
			target = base + "/conversations/" + rep.conv
		}
		if rep.status != "success" {
			msg := rep.err
			if msg == "" {
				msg = rep.status
			}
			return n, fmt.Errorf("the target did not take the negotiation: %s", msg)
		}
		body, _ := agora.Query(rep.body)
		if n, err = s.neg.Receive(ctx, n.Name, body, "", "", nil); err != nil {
			return negotiation.Negotiation{}, errors.New(negotiation.Failure(err))
		}
	}
	// Our answer closed the negotiation (we accepted a counter-proposal, or
	// rejected): the target still has to hear it, or it never installs the
	// PD.
	if n.State != negotiation.StateOpen && len(n.Outbound) > 0 {
		rep, err := s.postTo(ctx, target, d, negotiation.PDHash, pd, n.Outbound, true)
		if n.State != negotiation.StateAccepted {
			return n, nil // a rejection is best effort
		}
		if err != nil {
			return n, err
		}
		if rep.status != "success" {
			return n, fmt.Errorf("the target did not take our acceptance: %s %s", rep.status, rep.err)
		}
	}
	return n, nil
}

// negotiationPD returns the negotiation PD's bytes and makes sure our
// registry holds it (so /protocols/{hash} serves it to peers).
func (s *Sender) negotiationPD(ctx context.Context) ([]byte, error) {
	s.negPDMu.Lock()
	defer s.negPDMu.Unlock()
	if s.negPD != nil {
		return s.negPD, nil
	}
	pd, err := s.neg.Protocol(ctx)
	if err != nil {
		return nil, fmt.Errorf("the negotiation protocol is unavailable: %w", err)
	}
	if err := s.dir.Register(ctx, pd); err != nil {
		s.opts.Logger.WarnContext(ctx, "negotiation PD not registered; peers get it as a data: URI only", slog.Any("err", err))
	}
	s.negPD = pd
	return s.negPD, nil
}

// endRemoteConversation sends DELETE to a conversation URL, best effort.
func (s *Sender) endRemoteConversation(ctx context.Context, u string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, u, bytes.NewReader(nil))
	if err != nil {
		return
	}
	if resp, err := s.client.Do(req); err == nil {
		resp.Body.Close()
	}
}
