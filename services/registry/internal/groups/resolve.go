package groups

import (
	"context"
	"errors"
	"slices"
	"strings"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// The reasons of a refused recipient or group.
const (
	RefusedAgentNotFound = "AGENT_NOT_FOUND"
	RefusedNotConnected  = "NOT_CONNECTED"
	RefusedGroupNotFound = "GROUP_NOT_FOUND"
	RefusedMembersOnly   = "GROUP_MEMBERS_ONLY"
)

// List is a distribution list (socontra.md section 3) and its sender.
type List struct {
	Sender  string
	Direct  []string
	Groups  []*registryv1.GroupTarget
	Regions []*registryv1.Region
}

// Scoped returns the groups a target reaches, the named one first:
// direct is the group; local adds its descendants; global adds
// descendants and ancestors (never siblings); exclusive adds ancestors
// only. Ancestors that do not exist are skipped.
func Scoped(r store.GroupReader, g *registryv1.Group, scope registryv1.GroupScope) ([]*registryv1.Group, error) {
	out := []*registryv1.Group{g}
	if scope == registryv1.GroupScope_GROUP_SCOPE_LOCAL || scope == registryv1.GroupScope_GROUP_SCOPE_GLOBAL {
		d, err := r.Descendants(g.GetPath())
		if err != nil {
			return nil, err
		}
		out = append(out, d...)
	}
	if scope == registryv1.GroupScope_GROUP_SCOPE_GLOBAL || scope == registryv1.GroupScope_GROUP_SCOPE_EXCLUSIVE {
		for p := Parent(g.GetPath()); p != ""; p = Parent(p) {
			a, err := r.Group(p)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			out = append(out, a)
		}
	}
	return out, nil
}

// RegionsMatch is the region filter of one membership: when the list or
// the membership names no region, it passes; otherwise some pair must
// match, country equal and state and city equal where both name one (a
// missing level is a wildcard). Comparison ignores case.
func RegionsMatch(want, have []*registryv1.Region) bool {
	if len(want) == 0 || len(have) == 0 {
		return true
	}
	level := func(a, b string) bool { return a == "" || b == "" || strings.EqualFold(a, b) }
	for _, w := range want {
		for _, h := range have {
			if strings.EqualFold(w.GetCountry(), h.GetCountry()) && level(w.GetState(), h.GetState()) && level(w.GetCity(), h.GetCity()) {
				return true
			}
		}
	}
	return false
}

// Resolve resolves a distribution list: the direct agents, plus the
// members of every group each target's scope reaches whose membership
// passes the region filter; de-duplicated; without the sender; then each
// checked for permission (socontra.md section 2). A recipient is allowed
// when it follows the sender, shares the sender's client group, or was
// reached through a group the sender may address: an open_public group,
// or a restricted one the sender is a member of. Members of a group the
// sender may not address are never listed, so a refusal does not reveal
// them: the group itself is refused (GROUP_NOT_FOUND for a
// restricted_private group, as for a missing one; GROUP_MEMBERS_ONLY for
// a restricted_public one). Recipients come sorted by name, refusals in
// the order found.
//
// Resolve stops with ctx's error when ctx ends, checked per group and
// every 1024 members.
func Resolve(ctx context.Context, r store.GroupReader, l List) (*registryv1.ResolveRecipientsResponse, error) {
	resp := &registryv1.ResolveRecipientsResponse{}
	viaGroup := map[string]bool{} // agent → reached through an addressable group
	refuseGroup := func(path, reason, msg string) {
		resp.Refusals = append(resp.Refusals, &registryv1.RecipientRefusal{Group: path, Reason: reason, Message: msg})
	}
	refusedGroups := map[string]bool{}
	for _, t := range l.Groups {
		g, err := r.Group(t.GetGroup())
		if errors.Is(err, store.ErrNotFound) {
			refuseGroup(t.GetGroup(), RefusedGroupNotFound, "group "+t.GetGroup()+" does not exist")
			continue
		}
		if err != nil {
			return nil, err
		}
		reached, err := Scoped(r, g, t.GetScope())
		if err != nil {
			return nil, err
		}
		for _, sg := range reached {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			ok, err := mayAddress(r, sg, l.Sender)
			if err != nil {
				return nil, err
			}
			if !ok {
				if refusedGroups[sg.GetPath()] {
					continue
				}
				refusedGroups[sg.GetPath()] = true
				if sg.GetAccess() == registryv1.GroupAccess_GROUP_ACCESS_RESTRICTED_PRIVATE {
					refuseGroup(sg.GetPath(), RefusedGroupNotFound, "group "+sg.GetPath()+" does not exist")
				} else {
					refuseGroup(sg.GetPath(), RefusedMembersOnly, "only members of group "+sg.GetPath()+" may address it")
				}
				continue
			}
			seen := 0
			err = r.EachMember(sg.GetPath(), func(m *registryv1.GroupMember) error {
				if seen++; seen%1024 == 0 && ctx.Err() != nil {
					return ctx.Err()
				}
				if RegionsMatch(l.Regions, m.GetRegions()) {
					viaGroup[m.GetAgent()] = true
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
		}
	}

	candidates := map[string]bool{}
	for _, a := range l.Direct {
		candidates[a] = true
	}
	for a := range viaGroup {
		candidates[a] = true
	}
	delete(candidates, l.Sender)
	names := make([]string, 0, len(candidates))
	for a := range candidates {
		names = append(names, a)
	}
	slices.Sort(names)
	for _, a := range names {
		if viaGroup[a] {
			resp.Recipients = append(resp.Recipients, &registryv1.Recipient{Agent: a, Basis: registryv1.DialogueBasis_DIALOGUE_BASIS_GROUP})
			continue
		}
		basis, err := directBasis(r, l.Sender, a)
		if err != nil {
			return nil, err
		}
		switch basis {
		case registryv1.DialogueBasis_DIALOGUE_BASIS_UNSPECIFIED:
			exists, err := r.AgentExists(a)
			if err != nil {
				return nil, err
			}
			refusal := &registryv1.RecipientRefusal{Agent: a, Reason: RefusedNotConnected, Message: a + " neither follows the sender nor shares a client group or an addressed group with it"}
			if !exists {
				refusal.Reason, refusal.Message = RefusedAgentNotFound, "agent "+a+" does not exist"
			}
			resp.Refusals = append(resp.Refusals, refusal)
		default:
			resp.Recipients = append(resp.Recipients, &registryv1.Recipient{Agent: a, Basis: basis})
		}
	}
	return resp, nil
}

// mayAddress reports whether sender may address group g's members: any
// agent may address an open_public group, members only a restricted one.
func mayAddress(r store.GroupReader, g *registryv1.Group, sender string) (bool, error) {
	if g.GetAccess() == registryv1.GroupAccess_GROUP_ACCESS_OPEN_PUBLIC {
		return true, nil
	}
	_, err := r.Member(g.GetPath(), sender)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// directBasis is the connection letting sender start a dialogue with
// recipient outside groups: a follow, then the shared client group.
func directBasis(r store.GroupReader, sender, recipient string) (registryv1.DialogueBasis, error) {
	if ok, err := r.IsFollowing(recipient, sender); err != nil || ok {
		if ok {
			return registryv1.DialogueBasis_DIALOGUE_BASIS_FOLLOW, nil
		}
		return 0, err
	}
	ok, err := connected(r, sender, recipient)
	if err != nil || !ok {
		return 0, err
	}
	return registryv1.DialogueBasis_DIALOGUE_BASIS_CLIENT_GROUP, nil
}
