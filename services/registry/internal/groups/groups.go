// Package groups holds the rules of the agent network's hierarchical
// groups (socontra.md sections 1 to 3): who may create, join, invite,
// answer, remove and change member types, which notification each change
// sends, and how a distribution list resolves to recipients.
//
// Every rule runs inside one store transaction (store.GroupWriter), so the
// checks, the change and its notifications commit together or not at all:
// a refused call changes nothing. Callers validate the syntax of their
// input first (CheckPath, CheckRegions); these functions assume it.
package groups

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// The refusals of the group rules; callers map them to PermissionDenied
// (all but ErrParentMismatch and ErrImmutable, which are invalid input,
// and ErrLastAdmin, a failed precondition).
var (
	// ErrAdminOnly: the actor does not administer the group.
	ErrAdminOnly = errors.New("only an admin of the group may do this")
	// ErrMembersOnly: the actor is not a member of the group.
	ErrMembersOnly = errors.New("only a member of the group may do this")
	// ErrInviteOnly: restricted_private groups are joined by invite only.
	ErrInviteOnly = errors.New("the group is restricted_private: join by invite only")
	// ErrForeignClient: a top-level group must be under the creator's
	// own client.
	ErrForeignClient = errors.New("a top-level group must be under its creator's own client")
	// ErrNotConnected: an admin may invite only an agent that follows it,
	// shares its client group, or asked to join.
	ErrNotConnected = errors.New("the invitee neither follows the admin, shares its client group, nor asked to join")
	// ErrLastAdmin: the change would leave the group without an admin.
	// Leaving, removal and demotion of the last admin are refused rather
	// than a member promoted in its place: who runs a group is its
	// members' choice, not the server's. Make another member an admin
	// first.
	ErrLastAdmin = errors.New("the group's last admin cannot leave, be removed or be demoted; make another member an admin first")
)

// MismatchError reports a sub-group whose access, category or protocol
// differs from its parent's.
type MismatchError struct {
	Field  string // group.access, group.category or group.protocol
	Parent string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s must equal that of the parent group %q", e.Field, e.Parent)
}

// Notification types (socontra.md section 4).
const (
	NoteFollowed          = "followed"
	NoteUnfollowed        = "unfollowed"
	NoteJoinRequest       = "request_to_join_group"
	NoteJoinResponse      = "request_to_join_group_response"
	NoteInvite            = "invite_to_group"
	NoteInviteResponse    = "invite_to_group_response"
	NoteRemoved           = "removed_from_group"
	NoteMemberTypeChanged = "group_member_type_change"
)

// Limits of a path.
const (
	MaxSegment  = 63 // characters in one name
	MaxSegments = 9  // the client id plus 8 names
)

// CheckPath returns why path is not a group path, or "" when it is: a
// client id, then one to eight names of 1 to 63 printable characters
// without "/" or "~>".
func CheckPath(path string, validClient func(string) bool) string {
	if path == "" {
		return "is required"
	}
	segs := strings.Split(path, "/")
	if len(segs) < 2 {
		return "must be a client id followed by at least one group name (client/name)"
	}
	if len(segs) > MaxSegments {
		return fmt.Sprintf("has more than %d segments", MaxSegments)
	}
	if !validClient(segs[0]) {
		return fmt.Sprintf("starts with %q, which is not a client id", segs[0])
	}
	for i, s := range segs[1:] {
		switch {
		case s == "":
			return fmt.Sprintf("segment %d is empty", i+2)
		case len(s) > MaxSegment:
			return fmt.Sprintf("segment %d is longer than %d bytes", i+2, MaxSegment)
		case strings.Contains(s, "~>"):
			return fmt.Sprintf("segment %d contains the forbidden sequence \"~>\"", i+2)
		case strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
			return fmt.Sprintf("segment %d holds a character that is not printable", i+2)
		}
	}
	return ""
}

// CheckRegion returns why r is not a valid region, or "".
func CheckRegion(r *registryv1.Region) string {
	switch {
	case strings.TrimSpace(r.GetCountry()) == "":
		return "country is required"
	case r.GetCity() != "" && r.GetState() == "":
		return "city needs state"
	case len(r.GetCountry()) > 100 || len(r.GetState()) > 100 || len(r.GetCity()) > 100:
		return "country, state and city are at most 100 bytes each"
	}
	return ""
}

// Parent returns the path of the group's parent, or "" for a top-level
// group (client/name).
func Parent(path string) string {
	i := strings.LastIndexByte(path, '/')
	if strings.IndexByte(path, '/') == i {
		return ""
	}
	return path[:i]
}

// ClientOf returns the client id a group path starts with.
func ClientOf(path string) string {
	client, _, _ := strings.Cut(path, "/")
	return client
}

// agentClient returns the client id of an agent name
// clients/{client}/agents/{agent}.
func agentClient(agent string) string {
	rest := strings.TrimPrefix(agent, "clients/")
	client, _, _ := strings.Cut(rest, "/")
	return client
}

func isAdmin(m *registryv1.GroupMember) bool {
	return m.GetMemberType() == registryv1.MemberType_MEMBER_TYPE_ADMIN
}

// requireAgent fails with a NotFound naming agent when it is not
// registered.
func requireAgent(r store.GroupReader, agent string) error {
	ok, err := r.AgentExists(agent)
	if err != nil {
		return err
	}
	if !ok {
		return resource.NotFound("agent", agent)
	}
	return nil
}

// requireAdmin returns the group when actor administers it.
func requireAdmin(r store.GroupReader, path, actor string) (*registryv1.Group, error) {
	g, err := r.Group(path)
	if err != nil {
		return nil, err
	}
	m, err := r.Member(path, actor)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !isAdmin(m)) {
		return nil, ErrAdminOnly
	}
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Create stores g (path, access, category, protocol and descriptions
// taken from it) with actor as its first member and admin.
func Create(w store.GroupWriter, actor string, in *registryv1.Group, now time.Time) (*registryv1.Group, error) {
	if err := requireAgent(w, actor); err != nil {
		return nil, err
	}
	path := in.GetPath()
	if parent := Parent(path); parent == "" {
		if agentClient(actor) != ClientOf(path) {
			return nil, ErrForeignClient
		}
	} else {
		p, err := requireAdmin(w, parent, actor)
		if err != nil {
			return nil, err
		}
		switch {
		case p.GetAccess() != in.GetAccess():
			return nil, &MismatchError{Field: "group.access", Parent: parent}
		case p.GetCategory() != in.GetCategory():
			return nil, &MismatchError{Field: "group.category", Parent: parent}
		case p.GetProtocol() != in.GetProtocol():
			return nil, &MismatchError{Field: "group.protocol", Parent: parent}
		}
	}
	if _, err := w.Group(path); err == nil {
		return nil, resource.AlreadyExists("group", path)
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	ts := timestamppb.New(now)
	g := &registryv1.Group{
		Path:             path,
		DisplayName:      in.GetDisplayName(),
		Description:      in.GetDescription(),
		AgentDescription: in.GetAgentDescription(),
		Access:           in.GetAccess(),
		Category:         in.GetCategory(),
		Protocol:         in.GetProtocol(),
		Creator:          actor,
		CreateTime:       ts,
		UpdateTime:       ts,
	}
	if err := w.PutGroup(g); err != nil {
		return nil, err
	}
	return g, w.PutMember(&registryv1.GroupMember{Group: path, Agent: actor, MemberType: registryv1.MemberType_MEMBER_TYPE_ADMIN, JoinTime: ts})
}

// Update sets the fields of in named by paths (display_name,
// description, agent_description) on the group; actor must administer
// it.
func Update(w store.GroupWriter, actor string, in *registryv1.Group, paths []string, now time.Time) (*registryv1.Group, error) {
	g, err := requireAdmin(w, in.GetPath(), actor)
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		switch p {
		case "display_name":
			g.DisplayName = in.GetDisplayName()
		case "description":
			g.Description = in.GetDescription()
		case "agent_description":
			g.AgentDescription = in.GetAgentDescription()
		}
	}
	g.UpdateTime = timestamppb.New(now)
	return g, w.PutGroup(g)
}

// Join makes actor a member of an open_public group, or records its
// request to join a restricted_public one and notifies every admin. A
// member joining again, or an agent asking again, changes nothing.
func Join(w store.GroupWriter, actor, path string, regions []*registryv1.Region, now time.Time) (*registryv1.GroupMember, *registryv1.GroupJoinRequest, error) {
	g, err := w.Group(path)
	if err != nil {
		return nil, nil, err
	}
	if err := requireAgent(w, actor); err != nil {
		return nil, nil, err
	}
	if m, err := w.Member(path, actor); err == nil {
		return m, nil, nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, nil, err
	}
	switch g.GetAccess() {
	case registryv1.GroupAccess_GROUP_ACCESS_OPEN_PUBLIC:
		m := &registryv1.GroupMember{Group: path, Agent: actor, MemberType: registryv1.MemberType_MEMBER_TYPE_MEMBER, Regions: regions, JoinTime: timestamppb.New(now)}
		return m, nil, w.PutMember(m)
	case registryv1.GroupAccess_GROUP_ACCESS_RESTRICTED_PUBLIC:
		if r, err := w.JoinRequest(path, actor); err == nil {
			return nil, r, nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, nil, err
		}
		r := &registryv1.GroupJoinRequest{Group: path, Agent: actor, Regions: regions, CreateTime: timestamppb.New(now)}
		if err := w.PutJoinRequest(r); err != nil {
			return nil, nil, err
		}
		err := w.EachMember(path, func(m *registryv1.GroupMember) error {
			if !isAdmin(m) {
				return nil
			}
			return w.Notify(&registryv1.Notification{Type: NoteJoinRequest, Recipient: m.GetAgent(), Agent: actor, Group: path})
		})
		return nil, r, err
	default:
		return nil, nil, ErrInviteOnly
	}
}

// errEnough stops a walk of the members that has seen enough.
var errEnough = errors.New("enough")

// keepAnAdmin refuses, with ErrLastAdmin, a change that takes admin rights
// from m when m is the group's only admin.
func keepAnAdmin(r store.GroupReader, m *registryv1.GroupMember) error {
	if !isAdmin(m) {
		return nil
	}
	admins := 0
	err := r.EachMember(m.GetGroup(), func(o *registryv1.GroupMember) error {
		if isAdmin(o) {
			if admins++; admins > 1 {
				return errEnough
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, errEnough):
		return nil
	case err != nil:
		return err
	}
	return fmt.Errorf("group %q: %w", m.GetGroup(), ErrLastAdmin)
}

// Leave ends actor's membership. The last admin may not leave.
func Leave(w store.GroupWriter, actor, path string) error {
	if _, err := w.Group(path); err != nil {
		return err
	}
	m, err := w.Member(path, actor)
	if err != nil {
		return err
	}
	if err := keepAnAdmin(w, m); err != nil {
		return err
	}
	return w.DeleteMember(path, actor)
}

// SetRegions replaces the regions of actor's membership.
func SetRegions(w store.GroupWriter, actor, path string, regions []*registryv1.Region) (*registryv1.GroupMember, error) {
	if _, err := w.Group(path); err != nil {
		return nil, err
	}
	m, err := w.Member(path, actor)
	if err != nil {
		return nil, err
	}
	m.Regions = regions
	return m, w.PutMember(m)
}

// Invite records admin actor's invite of inv.Agent into inv.Group,
// replacing a pending one, answers the invitee's pending join request if
// any, and notifies the invitee. The invitee must follow the admin, share
// its client group, or have asked to join.
func Invite(w store.GroupWriter, actor string, inv *registryv1.GroupInvite, now time.Time) (*registryv1.GroupInvite, error) {
	path, invitee := inv.GetGroup(), inv.GetAgent()
	if _, err := requireAdmin(w, path, actor); err != nil {
		return nil, err
	}
	if err := requireAgent(w, invitee); err != nil {
		return nil, err
	}
	if _, err := w.Member(path, invitee); err == nil {
		return nil, resource.AlreadyExists("group member", invitee)
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	_, reqErr := w.JoinRequest(path, invitee)
	asked := reqErr == nil
	if reqErr != nil && !errors.Is(reqErr, store.ErrNotFound) {
		return nil, reqErr
	}
	if !asked {
		ok, err := connected(w, actor, invitee)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, ErrNotConnected
		}
	}
	if inv.GetMemberType() == registryv1.MemberType_MEMBER_TYPE_UNSPECIFIED {
		inv.MemberType = registryv1.MemberType_MEMBER_TYPE_MEMBER
	}
	inv.Inviter = actor
	inv.CreateTime = timestamppb.New(now)
	if err := w.PutInvite(inv); err != nil {
		return nil, err
	}
	if asked {
		if err := w.DeleteJoinRequest(path, invitee); err != nil {
			return nil, err
		}
	}
	return inv, w.Notify(&registryv1.Notification{
		Type: NoteInvite, Recipient: invitee, Agent: actor, Group: path,
		MemberType: inv.GetMemberType(), Conditions: inv.GetConditions(),
		PaymentRequired: inv.GetPaymentRequired(), HumanAuthorizationRequired: inv.GetHumanAuthorizationRequired(),
	})
}

// connected reports whether sender may message recipient outside any
// group: recipient follows sender, or both are in their client's group.
func connected(r store.GroupReader, sender, recipient string) (bool, error) {
	if ok, err := r.IsFollowing(recipient, sender); err != nil || ok {
		return ok, err
	}
	if agentClient(sender) != agentClient(recipient) {
		return false, nil
	}
	for _, a := range []string{sender, recipient} {
		if ok, err := r.InClientGroup(a); err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// AnswerJoinRequest lets admin actor accept or reject agent's pending
// request; the request is gone afterwards, so the first admin decides.
// The requester is notified.
func AnswerJoinRequest(w store.GroupWriter, actor, path, agent string, accept bool, now time.Time) error {
	if _, err := requireAdmin(w, path, actor); err != nil {
		return err
	}
	req, err := w.JoinRequest(path, agent)
	if err != nil {
		return err
	}
	if err := w.DeleteJoinRequest(path, agent); err != nil {
		return err
	}
	response := "rejected"
	if accept {
		response = "accepted"
		if err := w.PutMember(&registryv1.GroupMember{Group: path, Agent: agent, MemberType: registryv1.MemberType_MEMBER_TYPE_MEMBER, Regions: req.GetRegions(), JoinTime: timestamppb.New(now)}); err != nil {
			return err
		}
	}
	return w.Notify(&registryv1.Notification{Type: NoteJoinResponse, Recipient: agent, Agent: actor, Group: path, Response: response})
}

// Answer is an invitee's answer to an invite.
type Answer struct {
	Accept             bool
	Payment            string
	HumanAuthorization string
	Regions            []*registryv1.Region
}

// AnswerInvite accepts (starting membership with the invite's member
// type) or declines actor's pending invite and notifies the inviter.
func AnswerInvite(w store.GroupWriter, actor, path string, a Answer, now time.Time) (*registryv1.GroupMember, error) {
	if _, err := w.Group(path); err != nil {
		return nil, err
	}
	inv, err := w.Invite(path, actor)
	if err != nil {
		return nil, err
	}
	if err := w.DeleteInvite(path, actor); err != nil {
		return nil, err
	}
	var m *registryv1.GroupMember
	response := "rejected"
	if a.Accept {
		response = "accepted"
		m = &registryv1.GroupMember{Group: path, Agent: actor, MemberType: inv.GetMemberType(), Regions: a.Regions, JoinTime: timestamppb.New(now)}
		if err := w.PutMember(m); err != nil {
			return nil, err
		}
	}
	return m, w.Notify(&registryv1.Notification{
		Type: NoteInviteResponse, Recipient: inv.GetInviter(), Agent: actor, Group: path, Response: response,
		MemberType: inv.GetMemberType(), Payment: a.Payment, HumanAuthorization: a.HumanAuthorization,
	})
}

// RemoveMember lets admin actor remove agent from the group and notifies
// agent. The last admin may not be removed.
func RemoveMember(w store.GroupWriter, actor, path, agent string) error {
	if _, err := requireAdmin(w, path, actor); err != nil {
		return err
	}
	m, err := w.Member(path, agent)
	if err != nil {
		return err
	}
	if err := keepAnAdmin(w, m); err != nil {
		return err
	}
	if err := w.DeleteMember(path, agent); err != nil {
		return err
	}
	return w.Notify(&registryv1.Notification{Type: NoteRemoved, Recipient: agent, Agent: actor, Group: path})
}

// SetMemberType lets admin actor change agent's member type and notifies
// agent when it changed. The last admin may not be demoted.
func SetMemberType(w store.GroupWriter, actor, path, agent string, t registryv1.MemberType) (*registryv1.GroupMember, error) {
	if _, err := requireAdmin(w, path, actor); err != nil {
		return nil, err
	}
	m, err := w.Member(path, agent)
	if err != nil {
		return nil, err
	}
	if m.GetMemberType() == t {
		return m, nil
	}
	if err := keepAnAdmin(w, m); err != nil {
		return nil, err
	}
	m.MemberType = t
	if err := w.PutMember(m); err != nil {
		return nil, err
	}
	return m, w.Notify(&registryv1.Notification{Type: NoteMemberTypeChanged, Recipient: agent, Agent: actor, Group: path, MemberType: t})
}

// CanSee reports whether viewer (an agent name, or "" for a caller that
// is no agent) may see the group: any group but a restricted_private one,
// which only its members see.
func CanSee(r store.GroupReader, g *registryv1.Group, viewer string) (bool, error) {
	if g.GetAccess() != registryv1.GroupAccess_GROUP_ACCESS_RESTRICTED_PRIVATE {
		return true, nil
	}
	if viewer == "" {
		return false, nil
	}
	_, err := r.Member(g.GetPath(), viewer)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}
