package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/fault"
	"github.com/parleyhq/parley/services/dispatcher/internal/protocolcontrol"
)

// registryResolver is dialogue.Resolver over the registry's
// ResolveRecipients, which owns the rules: scopes, regions,
// de-duplication, existence and permission per recipient.
type registryResolver struct {
	c registryv1.RegistryServiceClient
}

// registryRefusals maps ResolveRecipients' refusal reasons onto the core's.
var registryRefusals = map[string]dialogue.Reason{
	"AGENT_NOT_FOUND":    dialogue.ReasonUnknownAgent,
	"NOT_CONNECTED":      dialogue.ReasonPermission,
	"GROUP_NOT_FOUND":    dialogue.ReasonGroupNotFound,
	"GROUP_MEMBERS_ONLY": dialogue.ReasonPermission,
}

var registryScopes = map[dialogue.Scope]registryv1.GroupScope{
	dialogue.ScopeDirect:    registryv1.GroupScope_GROUP_SCOPE_DIRECT,
	dialogue.ScopeLocal:     registryv1.GroupScope_GROUP_SCOPE_LOCAL,
	dialogue.ScopeGlobal:    registryv1.GroupScope_GROUP_SCOPE_GLOBAL,
	dialogue.ScopeExclusive: registryv1.GroupScope_GROUP_SCOPE_EXCLUSIVE,
}

func (r registryResolver) Resolve(ctx context.Context, sender string, l dialogue.List) ([]dialogue.Candidate, error) {
	req := &registryv1.ResolveRecipientsRequest{Sender: sender, Direct: l.Direct}
	for _, g := range l.Groups {
		req.Groups = append(req.Groups, &registryv1.GroupTarget{Group: g.Path, Scope: registryScopes[g.Scope]})
	}
	for _, rg := range l.Regions {
		req.Regions = append(req.Regions, &registryv1.Region{Country: rg.Country, State: rg.State, City: rg.City})
	}
	resp, err := r.c.ResolveRecipients(ctx, req)
	if status.Code(err) == codes.InvalidArgument {
		return nil, listViolations(err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dialogue.ErrUnavailable, registryError(err))
	}
	out := make([]dialogue.Candidate, 0, len(resp.GetRecipients())+len(resp.GetRefusals()))
	for _, rc := range resp.GetRecipients() {
		out = append(out, dialogue.Candidate{Agent: rc.GetAgent()})
	}
	for _, rf := range resp.GetRefusals() {
		reason, ok := registryRefusals[rf.GetReason()]
		if !ok {
			reason = dialogue.ReasonPermission
		}
		out = append(out, dialogue.Candidate{Agent: rf.GetAgent(), Group: rf.GetGroup(), Refused: reason, Detail: rf.GetMessage()})
	}
	return out, nil
}

// listViolations turns the registry's verdict on a distribution list into
// ours: the same rule, with the fields named as in our request (under to).
func listViolations(err error) error {
	var v grpcerr.Violations
	for _, d := range status.Convert(err).Details() {
		br, ok := d.(*errdetails.BadRequest)
		if !ok {
			continue
		}
		for _, f := range br.GetFieldViolations() {
			// The registry's GroupTarget.group is our GroupAddress.path.
			field := f.GetField()
			if strings.HasPrefix(field, "groups[") && strings.HasSuffix(field, "].group") {
				field = strings.TrimSuffix(field, "group") + "path"
			}
			v.Add("to."+field, f.GetDescription())
		}
	}
	if len(v) == 0 {
		v.Add("to", status.Convert(err).Message())
	}
	return v.Err("INVALID_ARGUMENT", Domain)
}

// protocolMachines is dialogue.Protocols over the directory: a PD's state
// machine, compiled once per hash (internal/protocolcontrol).
type protocolMachines struct {
	dir *directory.Directory
}

func (p protocolMachines) Machine(ctx context.Context, hash string) (dialogue.Machine, error) {
	pr, err := p.dir.Protocol(ctx, hash, nil)
	switch {
	case errors.Is(err, directory.ErrNotFound), errors.Is(err, directory.ErrRefused):
		return nil, fault.New(dialogue.ErrUnknownProtocol, fmt.Sprintf("protocol %s is not known to the registry; register its PD first", hash))
	case err != nil:
		return nil, fmt.Errorf("%w: %w", dialogue.ErrUnavailable, err)
	case pr.MachineErr != nil:
		return nil, fault.New(dialogue.ErrUnknownProtocol, fmt.Sprintf("protocol %s declares a state machine that does not compile: %v", hash, pr.MachineErr))
	case pr.Machine == nil:
		return nil, nil
	}
	return machine{pr.Machine}, nil
}

// machine is dialogue.Machine over protocolcontrol: the pair is the
// dialogue's initiator and one counterpart, so a message between two
// counterparts finds no opened pair and is refused (NOT_AN_OPENER).
type machine struct{ m *protocolcontrol.Machine }

func (m machine) OpensOrder(typ string) bool { return m.m.OpensOrder(typ) }

func (m machine) Step(state json.RawMessage, s dialogue.Step) (dialogue.Accepted, error) {
	party := protocolcontrol.Counterpart
	if s.Sender == s.Initiator {
		party = protocolcontrol.Initiator
	}
	res, err := m.m.Check(state, protocolcontrol.Input{Sender: party, Type: s.Type, AnswersType: s.AnsweredType, Body: s.Body, Now: s.Time})
	var v *protocolcontrol.Violation
	if errors.As(err, &v) {
		return dialogue.Accepted{}, &dialogue.Violation{Rule: string(v.Rule), Detail: v.Error(), State: v.State, Deadline: cmp.Or(v.Deadline, v.Expired)}
	}
	if err != nil {
		return dialogue.Accepted{}, err
	}
	out := dialogue.Accepted{State: res.State, Body: res.Body}
	for _, d := range res.Pair.Deadlines {
		out.Deadlines = append(out.Deadlines, dialogue.Deadline{Name: d.Name, At: d.At})
	}
	return out, nil
}
