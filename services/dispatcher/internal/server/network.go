package server

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
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
