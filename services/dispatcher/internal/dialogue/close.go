package dialogue

import (
	"context"
	"slices"

	"github.com/parleyhq/parley/platform/sweep"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// The close operations are filters an agent sets on what it receives in a
// dialogue (socontra.md section 6). The send path reads them: a recipient
// that closed is left out with ReasonClosed. Each returns the agent's view
// of the dialogue as written; store.ErrNotFound (a *resource.Error) when
// the dialogue is unknown or the agent takes no part in it.

// CloseMessages stops agent receiving messages of the given types in
// dialogue, from anyone.
func (s *Service) CloseMessages(ctx context.Context, agent, dialogue string, types []string) (View, error) {
	return s.update(ctx, agent, dialogue, func(_ *store.Dialogue, p *store.Participant) {
		p.ClosedTypes = union(p.ClosedTypes, types)
	})
}

// CloseAgent stops agent receiving messages from counterpart in dialogue.
func (s *Service) CloseAgent(ctx context.Context, agent, dialogue, counterpart string) (View, error) {
	return s.update(ctx, agent, dialogue, func(_ *store.Dialogue, p *store.Participant) {
		p.ClosedAgents = union(p.ClosedAgents, []string{counterpart})
	})
}

// Close closes dialogue: for everyone when agent is its initiator (no one
// may send in it any more), else for agent alone, which receives nothing
// more in it. When the initiator closes a service dialogue, every supplier
// whose pair is still open first gets task_withdrawn.
func (s *Service) Close(ctx context.Context, agent, dialogue string) (View, error) {
	if err := s.withdraw(ctx, agent, dialogue); err != nil {
		return View{}, err
	}
	return s.update(ctx, agent, dialogue, s.closeFor(agent))
}

// CloseAll closes every dialogue of agent that is open for it, as Close
// does, and returns how many it closed.
func (s *Service) CloseAll(ctx context.Context, agent string) (int, error) {
	// The service dialogues it opened withdraw their tasks first; the
	// first pass only reads.
	var opened []string
	if _, err := s.store.UpdateAgentDialogues(ctx, agent, func(d *store.Dialogue, _ *store.Participant) (bool, error) {
		if d.Initiator == agent && d.Category == string(mailbox.CategoryService) {
			opened = append(opened, d.ID)
		}
		return false, nil
	}); err != nil {
		return 0, err
	}
	for _, id := range opened {
		if err := s.withdraw(ctx, agent, id); err != nil {
			return 0, err
		}
	}
	closeOne := s.closeFor(agent)
	return s.store.UpdateAgentDialogues(ctx, agent, func(d *store.Dialogue, p *store.Participant) (bool, error) {
		closeOne(d, p)
		return true, nil
	})
}

func (s *Service) closeFor(agent string) func(*store.Dialogue, *store.Participant) {
	now := s.opts.Now().UTC()
	return func(d *store.Dialogue, p *store.Participant) {
		switch {
		case d.Initiator != agent:
			p.Closed = true
		case !d.Closed: // a second close keeps the first close time, which the retention counts from
			d.Closed, d.CloseTime = true, now
		}
	}
}

func (s *Service) update(ctx context.Context, agent, dialogue string, mutate func(*store.Dialogue, *store.Participant)) (View, error) {
	d, p, err := s.store.UpdateParticipant(ctx, dialogue, agent, func(d *store.Dialogue, p *store.Participant) error {
		mutate(d, p)
		return nil
	})
	if err != nil {
		return View{}, err
	}
	return View{Dialogue: d, Participant: p}, nil
}

// union returns a with the elements of b it lacks, sorted.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	slices.Sort(out)
	return out
}

// SweepDialogues removes the dialogues closed (broadcasts: sent) longer
// than Options.Retention ago, in transactions of at most sweep.Batch,
// and returns how many it removed. Their messages stay in the mailboxes
// until compaction; a reply to one is refused as not received.
func (s *Service) SweepDialogues(ctx context.Context) (int, error) {
	return sweep.InBatches(ctx, s.opts.Now().Add(-s.opts.Retention), s.store.SweepDialogues)
}
