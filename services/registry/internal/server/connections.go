package server

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/emptypb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// Reasons of the connection RPCs.
const (
	reasonFollowSelf       = "FOLLOW_SELF"
	reasonNotClientsMember = "CLIENT_GROUP_FOREIGN"
)

// Names are checked against resource.ValidID (63 characters per id), which is
// also their size limit.

// FollowAgent implements RegistryService.
func (s *Server) FollowAgent(ctx context.Context, req *registryv1.FollowAgentRequest) (*registryv1.Follow, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	checkAgentName(&v, "agent", req.GetAgent())
	if len(v) == 0 && req.GetName() == req.GetAgent() {
		v.Add("agent", "an agent cannot follow itself")
		return nil, v.Err(reasonFollowSelf, Domain)
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	if _, err := s.store.Follow(ctx, req.GetName(), req.GetAgent()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	s.outbox.wake() // a new follow wrote a notification
	return &registryv1.Follow{Follower: req.GetName(), Agent: req.GetAgent()}, nil
}

// UnfollowAgent implements RegistryService.
func (s *Server) UnfollowAgent(ctx context.Context, req *registryv1.UnfollowAgentRequest) (*emptypb.Empty, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	checkAgentName(&v, "agent", req.GetAgent())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	if err := s.store.Unfollow(ctx, req.GetName(), req.GetAgent()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	s.outbox.wake()
	return &emptypb.Empty{}, nil
}

// ListFollowers implements RegistryService.
func (s *Server) ListFollowers(ctx context.Context, req *registryv1.ListFollowersRequest) (*registryv1.ListFollowersResponse, error) {
	names, next, err := s.listNames(ctx, "followers", req.GetParent(), req.GetPageSize(), req.GetPageToken(), checkAgentName, s.store.ListFollowers)
	if err != nil {
		return nil, err
	}
	return &registryv1.ListFollowersResponse{Agents: names, NextPageToken: next}, nil
}

// ListFollowing implements RegistryService.
func (s *Server) ListFollowing(ctx context.Context, req *registryv1.ListFollowingRequest) (*registryv1.ListFollowingResponse, error) {
	names, next, err := s.listNames(ctx, "following", req.GetParent(), req.GetPageSize(), req.GetPageToken(), checkAgentName, s.store.ListFollowing)
	if err != nil {
		return nil, err
	}
	return &registryv1.ListFollowingResponse{Agents: names, NextPageToken: next}, nil
}

// JoinClientGroup implements RegistryService.
func (s *Server) JoinClientGroup(ctx context.Context, req *registryv1.JoinClientGroupRequest) (*emptypb.Empty, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	if err := s.store.JoinClientGroup(ctx, req.GetName()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &emptypb.Empty{}, nil
}

// LeaveClientGroup implements RegistryService.
func (s *Server) LeaveClientGroup(ctx context.Context, req *registryv1.LeaveClientGroupRequest) (*emptypb.Empty, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	if err := s.store.LeaveClientGroup(ctx, req.GetName()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &emptypb.Empty{}, nil
}

// ListClientGroupMembers implements RegistryService. The policy admits any
// key; a client's group is visible to that client's own keys (its agents'
// too, which the policy's ownership rule cannot express) and the operator.
// With access control off there is no principal and no check.
func (s *Server) ListClientGroupMembers(ctx context.Context, req *registryv1.ListClientGroupMembersRequest) (*registryv1.ListClientGroupMembersResponse, error) {
	if p, ok := auth.FromContext(ctx); ok && p.Kind != auth.Operator && p.Client != req.GetParent() {
		return nil, grpcerr.New(codes.PermissionDenied, "only "+req.GetParent()+"'s own keys may list its group's members", reasonNotClientsMember, Domain, map[string]string{"client": req.GetParent()})
	}
	names, next, err := s.listNames(ctx, "client_group", req.GetParent(), req.GetPageSize(), req.GetPageToken(), checkClientName, s.store.ListClientGroupMembers)
	if err != nil {
		return nil, err
	}
	return &registryv1.ListClientGroupMembersResponse{Agents: names, NextPageToken: next}, nil
}

// listNames validates a list request over agent names and reads one page
// of it (AIP-158: page_size 0 is 50, at most 1000, negative is invalid; the
// token is bound to the list and its parent).
func (s *Server) listNames(ctx context.Context, list, parent string, pageSize int32, token string,
	checkParent func(*grpcerr.Violations, string, string),
	read func(context.Context, string, store.ListOptions) ([]string, error),
) ([]string, string, error) {
	var v grpcerr.Violations
	checkParent(&v, "parent", parent)
	size, ok := pagetoken.Size(pageSize, 50, 1000)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	after, err := pagetoken.Decode(token, list, parent)
	if err != nil {
		v.Add("page_token", "is not a token from this list with these parameters")
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, "", err
	}
	names, err := read(ctx, parent, store.ListOptions{After: after, Limit: size + 1})
	if err != nil {
		return nil, "", s.toStatus(ctx, err)
	}
	if len(names) <= size {
		return names, "", nil
	}
	return names[:size], pagetoken.Encode(names[size-1], list, parent), nil
}

// CheckDialoguePermission implements RegistryService: the recipient
// follows the sender, or both are members of their shared client's group.
// Open groups (issue 13) are not built yet.
func (s *Server) CheckDialoguePermission(ctx context.Context, req *registryv1.CheckDialoguePermissionRequest) (*registryv1.CheckDialoguePermissionResponse, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "sender", req.GetSender())
	checkAgentName(&v, "recipient", req.GetRecipient())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	sender, recipient := req.GetSender(), req.GetRecipient()
	follows, err := s.store.IsFollowing(ctx, recipient, sender)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if follows {
		return &registryv1.CheckDialoguePermissionResponse{Allowed: true, Basis: registryv1.DialogueBasis_DIALOGUE_BASIS_FOLLOW}, nil
	}
	if clientOf(sender) == clientOf(recipient) && sender != recipient {
		both := true
		for _, a := range []string{sender, recipient} {
			in, err := s.store.InClientGroup(ctx, a)
			if err != nil {
				return nil, s.toStatus(ctx, err)
			}
			both = both && in
		}
		if both {
			return &registryv1.CheckDialoguePermissionResponse{Allowed: true, Basis: registryv1.DialogueBasis_DIALOGUE_BASIS_CLIENT_GROUP}, nil
		}
	}
	return &registryv1.CheckDialoguePermissionResponse{}, nil
}

// clientOf returns clients/{client} of a valid agent name.
func clientOf(agent string) string {
	i := strings.Index(agent, "/agents/")
	return agent[:i]
}
