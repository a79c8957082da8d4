package server

import (
	"context"
	"errors"
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/emptypb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/groups"
	"github.com/parleyhq/parley/services/registry/internal/pd"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// Reasons of the group RPCs.
const (
	reasonGroupAdminOnly     = "GROUP_ADMIN_ONLY"
	reasonGroupMembersOnly   = "GROUP_MEMBERS_ONLY"
	reasonGroupInviteOnly    = "GROUP_INVITE_ONLY"
	reasonGroupForeign       = "GROUP_CLIENT_FOREIGN"
	reasonGroupNotConnected  = "GROUP_INVITEE_NOT_CONNECTED"
	reasonGroupLastAdmin     = "GROUP_LAST_ADMIN"
	reasonGroupMismatch      = "GROUP_PARENT_MISMATCH"
	reasonGroupImmutable     = "GROUP_FIELD_IMMUTABLE"
	reasonDistributionList   = "DISTRIBUTION_LIST_INVALID"
	maxGroupText             = 2048 // description, agent_description, conditions
	maxRegions               = 20   // on one membership
	maxListRegions           = 50   // on a distribution list
	maxDirect                = 1000
	maxTargets               = 50
	maxSearchResults         = 350 // socontra.md section 1
	maxPendingListed         = 1000
	maxQuery                 = 200
	maxPayment               = 512
	maxNotificationsWait     = 30 // seconds
	defaultNotificationsPage = 100
	notificationsTrimBatch   = 1000             // dropped per transaction by a trim
	resolveTimeout           = 10 * time.Second // one ResolveRecipients
)

// groupErr maps the group rules' refusals; others go to toStatus.
func (s *Server) groupErr(ctx context.Context, err error) error {
	var mm *groups.MismatchError
	switch {
	case errors.As(err, &mm):
		v := grpcerr.Violations{{Field: mm.Field, Description: mm.Error()}}
		return v.Err(reasonGroupMismatch, Domain)
	case errors.Is(err, groups.ErrAdminOnly):
		return grpcerr.New(codes.PermissionDenied, err.Error(), reasonGroupAdminOnly, Domain, nil)
	case errors.Is(err, groups.ErrMembersOnly):
		return grpcerr.New(codes.PermissionDenied, err.Error(), reasonGroupMembersOnly, Domain, nil)
	case errors.Is(err, groups.ErrInviteOnly):
		return grpcerr.New(codes.PermissionDenied, err.Error(), reasonGroupInviteOnly, Domain, nil)
	case errors.Is(err, groups.ErrForeignClient):
		return grpcerr.New(codes.PermissionDenied, err.Error(), reasonGroupForeign, Domain, nil)
	case errors.Is(err, groups.ErrNotConnected):
		return grpcerr.New(codes.PermissionDenied, err.Error(), reasonGroupNotConnected, Domain, nil)
	case errors.Is(err, groups.ErrLastAdmin):
		return grpcerr.New(codes.FailedPrecondition, err.Error(), reasonGroupLastAdmin, Domain, nil)
	}
	return s.toStatus(ctx, err)
}

// update runs a group rule in one transaction and wakes notification
// readers once it has committed.
func (s *Server) update(ctx context.Context, fn func(store.GroupWriter) error) error {
	if err := s.store.UpdateGroups(ctx, fn); err != nil {
		return s.groupErr(ctx, err)
	}
	s.outbox.wake()
	return nil
}

func checkGroupPath(v *grpcerr.Violations, field, path string) {
	if why := groups.CheckPath(path, resource.ValidID); why != "" {
		v.Add(field, why)
	}
}

func checkRegions(v *grpcerr.Violations, regions []*registryv1.Region, most int) {
	if len(regions) > most {
		v.Add("regions", "has more than "+strconv.Itoa(most)+" regions")
		return
	}
	for i, r := range regions {
		if why := groups.CheckRegion(r); why != "" {
			v.Add("regions["+strconv.Itoa(i)+"]", why)
		}
	}
}

func checkText(v *grpcerr.Violations, field, text string, most int) {
	if len(text) > most {
		v.Add(field, "is longer than "+strconv.Itoa(most)+" bytes")
	} else if !utf8.ValidString(text) {
		v.Add(field, "is not valid UTF-8")
	}
}

func checkMemberType(v *grpcerr.Violations, field string, t registryv1.MemberType, optional bool) {
	if _, ok := registryv1.MemberType_name[int32(t)]; !ok || (!optional && t == registryv1.MemberType_MEMBER_TYPE_UNSPECIFIED) {
		v.Add(field, "must be MEMBER_TYPE_MEMBER or MEMBER_TYPE_ADMIN")
	}
}

// CreateGroup implements RegistryService.
func (s *Server) CreateGroup(ctx context.Context, req *registryv1.CreateGroupRequest) (*registryv1.Group, error) {
	var v grpcerr.Violations
	g := req.GetGroup()
	checkAgentName(&v, "name", req.GetName())
	checkGroupPath(&v, "group.path", g.GetPath())
	if g.GetAccess() == registryv1.GroupAccess_GROUP_ACCESS_UNSPECIFIED || registryv1.GroupAccess_name[int32(g.GetAccess())] == "" {
		v.Add("group.access", "must be open_public, restricted_public or restricted_private")
	}
	if g.GetCategory() == registryv1.GroupCategory_GROUP_CATEGORY_UNSPECIFIED || registryv1.GroupCategory_name[int32(g.GetCategory())] == "" {
		v.Add("group.category", "must be message, subscription or service")
	}
	if p := g.GetProtocol(); p != "" {
		if h, err := pd.ParseHash(p); err != nil || h.Hex() != p {
			v.Add("group.protocol", "must be a SHA-1 as 40 lowercase hex digits")
		}
	}
	checkGroupTexts(&v, g)
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	var out *registryv1.Group
	err := s.update(ctx, func(w store.GroupWriter) error {
		var err error
		out, err = groups.Create(w, req.GetName(), g, s.now())
		return err
	})
	return out, err
}

func checkGroupTexts(v *grpcerr.Violations, g *registryv1.Group) {
	checkText(v, "group.display_name", g.GetDisplayName(), maxDisplayName)
	checkText(v, "group.description", g.GetDescription(), maxGroupText)
	checkText(v, "group.agent_description", g.GetAgentDescription(), maxGroupText)
}

// UpdateGroup implements RegistryService.
func (s *Server) UpdateGroup(ctx context.Context, req *registryv1.UpdateGroupRequest) (*registryv1.Group, error) {
	var v grpcerr.Violations
	g := req.GetGroup()
	checkAgentName(&v, "name", req.GetName())
	checkGroupPath(&v, "group.path", g.GetPath())
	checkGroupTexts(&v, g)
	mutable := []string{"display_name", "description", "agent_description"}
	var paths []string
	switch {
	case len(req.GetUpdateMask().GetPaths()) == 1 && req.GetUpdateMask().GetPaths()[0] == "*":
		paths = mutable
	case len(req.GetUpdateMask().GetPaths()) > 0:
		for _, p := range req.GetUpdateMask().GetPaths() {
			switch p {
			case "display_name", "description", "agent_description":
				paths = append(paths, p)
			case "path", "creator", "create_time", "update_time":
			case "access", "category", "protocol":
				v.Add("update_mask", p+" is immutable")
			default:
				v.Add("update_mask", "unknown field "+p)
			}
		}
	default:
		for _, p := range mutable {
			if (p == "display_name" && g.GetDisplayName() != "") || (p == "description" && g.GetDescription() != "") || (p == "agent_description" && g.GetAgentDescription() != "") {
				paths = append(paths, p)
			}
		}
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	var out *registryv1.Group
	err := s.update(ctx, func(w store.GroupWriter) error {
		var err error
		out, err = groups.Update(w, req.GetName(), g, paths, s.now())
		return err
	})
	return out, err
}

// GetGroup implements RegistryService. A restricted_private group is
// NOT_FOUND to callers who are neither its members, its client's keys,
// nor the operator, so that its existence does not leak.
func (s *Server) GetGroup(ctx context.Context, req *registryv1.GetGroupRequest) (*registryv1.Group, error) {
	var v grpcerr.Violations
	checkGroupPath(&v, "path", req.GetPath())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	var out *registryv1.Group
	err := s.store.ViewGroups(ctx, func(r store.GroupReader) error {
		g, err := r.Group(req.GetPath())
		if err != nil {
			return err
		}
		p, ok := auth.FromContext(ctx)
		if ok && p.Kind != auth.Operator && p.Client != "clients/"+groups.ClientOf(g.GetPath()) {
			if seen, err := groups.CanSee(r, g, p.Agent); err != nil || !seen {
				if err == nil {
					err = resource.NotFound("group", req.GetPath()) // as if missing
				}
				return err
			}
		}
		out = g
		return nil
	})
	if err != nil {
		return nil, s.groupErr(ctx, err)
	}
	return out, nil
}

// SearchGroups implements RegistryService.
func (s *Server) SearchGroups(ctx context.Context, req *registryv1.SearchGroupsRequest) (*registryv1.SearchGroupsResponse, error) {
	var v grpcerr.Violations
	if req.GetQuery() == "" {
		v.Add("query", "is required")
	}
	checkText(&v, "query", req.GetQuery(), maxQuery)
	size, ok := pagetoken.Size(req.GetPageSize(), 50, maxSearchResults)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	// The token carries the last path and how many results came before.
	key, err := pagetoken.Decode(req.GetPageToken(), "group_search", req.GetQuery())
	var seen int
	after := ""
	if err != nil {
		v.Add("page_token", "is not a token from this search")
	} else if key != "" {
		n, rest, found := cutCount(key)
		if !found {
			v.Add("page_token", "is not a token from this search")
		}
		seen, after = n, rest
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	size = min(size, maxSearchResults-seen)
	if size <= 0 {
		return &registryv1.SearchGroupsResponse{}, nil
	}
	found, err := s.store.SearchGroups(ctx, store.ListOptions{After: after, Limit: size + 1, Query: req.GetQuery()})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &registryv1.SearchGroupsResponse{Groups: found}
	if len(found) > size {
		resp.Groups = found[:size]
		if seen+size < maxSearchResults {
			resp.NextPageToken = pagetoken.Encode(strconv.Itoa(seen+size)+"|"+found[size-1].GetPath(), "group_search", req.GetQuery())
		}
	}
	return resp, nil
}

// cutCount splits "n|rest".
func cutCount(key string) (int, string, bool) {
	for i := 0; i < len(key); i++ {
		if key[i] == '|' {
			n, err := strconv.Atoi(key[:i])
			return n, key[i+1:], err == nil && n >= 0
		}
	}
	return 0, "", false
}

// JoinGroup implements RegistryService.
func (s *Server) JoinGroup(ctx context.Context, req *registryv1.JoinGroupRequest) (*registryv1.JoinGroupResponse, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	checkGroupPath(&v, "group", req.GetGroup())
	checkRegions(&v, req.GetRegions(), maxRegions)
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	resp := &registryv1.JoinGroupResponse{}
	err := s.update(ctx, func(w store.GroupWriter) error {
		var err error
		resp.Member, resp.Request, err = groups.Join(w, req.GetName(), req.GetGroup(), req.GetRegions(), s.now())
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// LeaveGroup implements RegistryService.
func (s *Server) LeaveGroup(ctx context.Context, req *registryv1.LeaveGroupRequest) (*emptypb.Empty, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	checkGroupPath(&v, "group", req.GetGroup())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	if err := s.update(ctx, func(w store.GroupWriter) error { return groups.Leave(w, req.GetName(), req.GetGroup()) }); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// SetGroupRegions implements RegistryService.
func (s *Server) SetGroupRegions(ctx context.Context, req *registryv1.SetGroupRegionsRequest) (*registryv1.GroupMember, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	checkGroupPath(&v, "group", req.GetGroup())
	checkRegions(&v, req.GetRegions(), maxRegions)
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	var out *registryv1.GroupMember
	err := s.update(ctx, func(w store.GroupWriter) error {
		var err error
		out, err = groups.SetRegions(w, req.GetName(), req.GetGroup(), req.GetRegions())
		return err
	})
	return out, err
}

// InviteToGroup implements RegistryService.
func (s *Server) InviteToGroup(ctx context.Context, req *registryv1.InviteToGroupRequest) (*registryv1.GroupInvite, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	checkGroupPath(&v, "group", req.GetGroup())
	checkAgentName(&v, "agent", req.GetAgent())
	checkMemberType(&v, "member_type", req.GetMemberType(), true)
	checkText(&v, "conditions", req.GetConditions(), maxGroupText)
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	var out *registryv1.GroupInvite
	err := s.update(ctx, func(w store.GroupWriter) error {
		var err error
		out, err = groups.Invite(w, req.GetName(), &registryv1.GroupInvite{
			Group: req.GetGroup(), Agent: req.GetAgent(), MemberType: req.GetMemberType(), Conditions: req.GetConditions(),
			PaymentRequired: req.GetPaymentRequired(), HumanAuthorizationRequired: req.GetHumanAuthorizationRequired(),
		}, s.now())
		return err
	})
	return out, err
}

// AnswerGroupJoinRequest implements RegistryService.
func (s *Server) AnswerGroupJoinRequest(ctx context.Context, req *registryv1.AnswerGroupJoinRequestRequest) (*emptypb.Empty, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	checkGroupPath(&v, "group", req.GetGroup())
	checkAgentName(&v, "agent", req.GetAgent())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	err := s.update(ctx, func(w store.GroupWriter) error {
		return groups.AnswerJoinRequest(w, req.GetName(), req.GetGroup(), req.GetAgent(), req.GetAccept(), s.now())
	})
	if err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// AnswerGroupInvite implements RegistryService.
func (s *Server) AnswerGroupInvite(ctx context.Context, req *registryv1.AnswerGroupInviteRequest) (*registryv1.AnswerGroupInviteResponse, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	checkGroupPath(&v, "group", req.GetGroup())
	checkText(&v, "payment", req.GetPayment(), maxPayment)
	checkText(&v, "human_authorization", req.GetHumanAuthorization(), maxGroupText)
	checkRegions(&v, req.GetRegions(), maxRegions)
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	resp := &registryv1.AnswerGroupInviteResponse{}
	err := s.update(ctx, func(w store.GroupWriter) error {
		var err error
		resp.Member, err = groups.AnswerInvite(w, req.GetName(), req.GetGroup(), groups.Answer{
			Accept: req.GetAccept(), Payment: req.GetPayment(), HumanAuthorization: req.GetHumanAuthorization(), Regions: req.GetRegions(),
		}, s.now())
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// RemoveGroupMember implements RegistryService.
func (s *Server) RemoveGroupMember(ctx context.Context, req *registryv1.RemoveGroupMemberRequest) (*emptypb.Empty, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	checkGroupPath(&v, "group", req.GetGroup())
	checkAgentName(&v, "agent", req.GetAgent())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	if err := s.update(ctx, func(w store.GroupWriter) error {
		return groups.RemoveMember(w, req.GetName(), req.GetGroup(), req.GetAgent())
	}); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// SetGroupMemberType implements RegistryService.
func (s *Server) SetGroupMemberType(ctx context.Context, req *registryv1.SetGroupMemberTypeRequest) (*registryv1.GroupMember, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	checkGroupPath(&v, "group", req.GetGroup())
	checkAgentName(&v, "agent", req.GetAgent())
	checkMemberType(&v, "member_type", req.GetMemberType(), false)
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	var out *registryv1.GroupMember
	err := s.update(ctx, func(w store.GroupWriter) error {
		var err error
		out, err = groups.SetMemberType(w, req.GetName(), req.GetGroup(), req.GetAgent(), req.GetMemberType())
		return err
	})
	return out, err
}

// ListGroupMembers implements RegistryService.
func (s *Server) ListGroupMembers(ctx context.Context, req *registryv1.ListGroupMembersRequest) (*registryv1.ListGroupMembersResponse, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	checkGroupPath(&v, "group", req.GetGroup())
	size, ok := pagetoken.Size(req.GetPageSize(), 50, 1000)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	after, err := pagetoken.Decode(req.GetPageToken(), "group_members", req.GetGroup())
	if err != nil {
		v.Add("page_token", "is not a token from this list with these parameters")
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	resp := &registryv1.ListGroupMembersResponse{}
	err = s.store.ViewGroups(ctx, func(r store.GroupReader) error {
		g, err := r.Group(req.GetGroup())
		if err != nil {
			return err
		}
		if _, err := r.Member(g.GetPath(), req.GetName()); errors.Is(err, store.ErrNotFound) {
			return groups.ErrMembersOnly
		} else if err != nil {
			return err
		}
		page, err := r.Members(g.GetPath(), store.ListOptions{After: after, Limit: size + 1})
		if err != nil {
			return err
		}
		resp.Members = page
		if len(page) > size {
			resp.Members = page[:size]
			resp.NextPageToken = pagetoken.Encode(page[size-1].GetAgent(), "group_members", req.GetGroup())
		}
		return nil
	})
	if err != nil {
		return nil, s.groupErr(ctx, err)
	}
	return resp, nil
}

// ListAgentGroups implements RegistryService.
func (s *Server) ListAgentGroups(ctx context.Context, req *registryv1.ListAgentGroupsRequest) (*registryv1.ListAgentGroupsResponse, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "parent", req.GetParent())
	size, ok := pagetoken.Size(req.GetPageSize(), 50, 1000)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	list := "agent_groups"
	if req.GetAdminOnly() {
		list = "agent_groups_admin"
	}
	after, err := pagetoken.Decode(req.GetPageToken(), list, req.GetParent())
	if err != nil {
		v.Add("page_token", "is not a token from this list with these parameters")
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	resp := &registryv1.ListAgentGroupsResponse{}
	err = s.store.ViewGroups(ctx, func(r store.GroupReader) error {
		resp.Members, resp.NextPageToken = nil, ""
		for {
			// An admin-only list filters a page at a time until it has one
			// more than it returns, or the memberships end.
			page, err := r.AgentGroups(req.GetParent(), store.ListOptions{After: after, Limit: size + 1})
			if err != nil {
				return err
			}
			for _, m := range page {
				if req.GetAdminOnly() && m.GetMemberType() != registryv1.MemberType_MEMBER_TYPE_ADMIN {
					continue
				}
				if len(resp.Members) == size {
					resp.NextPageToken = pagetoken.Encode(resp.Members[size-1].GetGroup(), list, req.GetParent())
					return nil
				}
				resp.Members = append(resp.Members, m)
			}
			if len(page) <= size {
				return nil
			}
			after = page[len(page)-1].GetGroup()
		}
	})
	if err != nil {
		return nil, s.groupErr(ctx, err)
	}
	return resp, nil
}

// ListGroupJoinRequests implements RegistryService.
func (s *Server) ListGroupJoinRequests(ctx context.Context, req *registryv1.ListGroupJoinRequestsRequest) (*registryv1.ListGroupJoinRequestsResponse, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "parent", req.GetParent())
	checkGroupPath(&v, "group", req.GetGroup())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	resp := &registryv1.ListGroupJoinRequestsResponse{}
	err := s.store.ViewGroups(ctx, func(r store.GroupReader) error {
		g, err := r.Group(req.GetGroup())
		if err != nil {
			return err
		}
		m, err := r.Member(g.GetPath(), req.GetParent())
		if errors.Is(err, store.ErrNotFound) || (err == nil && m.GetMemberType() != registryv1.MemberType_MEMBER_TYPE_ADMIN) {
			return groups.ErrAdminOnly
		} else if err != nil {
			return err
		}
		resp.Requests, err = r.JoinRequests(g.GetPath(), maxPendingListed)
		return err
	})
	if err != nil {
		return nil, s.groupErr(ctx, err)
	}
	return resp, nil
}

// ListGroupInvites implements RegistryService.
func (s *Server) ListGroupInvites(ctx context.Context, req *registryv1.ListGroupInvitesRequest) (*registryv1.ListGroupInvitesResponse, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "parent", req.GetParent())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	resp := &registryv1.ListGroupInvitesResponse{}
	err := s.store.ViewGroups(ctx, func(r store.GroupReader) error {
		var err error
		resp.Invites, err = r.Invites(req.GetParent(), maxPendingListed)
		return err
	})
	if err != nil {
		return nil, s.groupErr(ctx, err)
	}
	return resp, nil
}

// ResolveRecipients implements RegistryService.
func (s *Server) ResolveRecipients(ctx context.Context, req *registryv1.ResolveRecipientsRequest) (*registryv1.ResolveRecipientsResponse, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "sender", req.GetSender())
	if len(req.GetDirect()) == 0 && len(req.GetGroups()) == 0 {
		v.Add("direct", "a distribution list needs direct agents or groups, or both")
	}
	if len(req.GetDirect()) > maxDirect {
		v.Add("direct", "has more than "+strconv.Itoa(maxDirect)+" agents")
	} else {
		for i, a := range req.GetDirect() {
			checkAgentName(&v, "direct["+strconv.Itoa(i)+"]", a)
		}
	}
	if len(req.GetGroups()) > maxTargets {
		v.Add("groups", "has more than "+strconv.Itoa(maxTargets)+" groups")
	} else {
		for i, t := range req.GetGroups() {
			field := "groups[" + strconv.Itoa(i) + "]"
			checkGroupPath(&v, field+".group", t.GetGroup())
			if t.GetScope() == registryv1.GroupScope_GROUP_SCOPE_UNSPECIFIED || registryv1.GroupScope_name[int32(t.GetScope())] == "" {
				v.Add(field+".scope", "must be direct, local, global or exclusive")
			}
		}
	}
	checkRegions(&v, req.GetRegions(), maxListRegions)
	if err := v.Err(reasonDistributionList, Domain); err != nil {
		return nil, err
	}
	// One list reads at most a few hundred thousand memberships; the bound
	// stops a runaway one from holding a read transaction open.
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	var out *registryv1.ResolveRecipientsResponse
	err := s.store.ViewGroups(ctx, func(r store.GroupReader) error {
		var err error
		out, err = groups.Resolve(ctx, r, groups.List{Sender: req.GetSender(), Direct: req.GetDirect(), Groups: req.GetGroups(), Regions: req.GetRegions()})
		return err
	})
	if err != nil {
		return nil, s.groupErr(ctx, err)
	}
	return out, nil
}
