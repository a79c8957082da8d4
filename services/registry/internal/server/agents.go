package server

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/fetch"
	"github.com/parleyhq/parley/services/registry/internal/pd"
	"github.com/parleyhq/parley/services/registry/internal/resolve"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// Limits on agent records and requests.
const (
	maxRequestID        = 128
	maxDisplayName      = 200
	maxDescription      = 2000
	maxComment          = 1024
	maxSourcesPerPD     = 10
	maxSourceURL        = 2048
	maxProtocolsInAList = 1000
)

// checkAgentName adds a violation on field unless name has the form
// clients/{client}/agents/{agent}.
func checkAgentName(v *grpcerr.Violations, field, name string) {
	if !resource.ValidAgentName(name) {
		v.Add(field, fmt.Sprintf("%q must have the form clients/{client}/agents/{agent}, each id 1 to 63 lowercase letters, digits or hyphens starting with a letter", name))
	}
}

// CreateAgent implements RegistryService.
func (s *Server) CreateAgent(ctx context.Context, req *registryv1.CreateAgentRequest) (*registryv1.Agent, error) {
	var v grpcerr.Violations
	client, ok := strings.CutPrefix(req.GetParent(), "clients/")
	if !ok || !resource.ValidID(client) {
		v.Add("parent", fmt.Sprintf("%q must have the form clients/{client}, the id 1 to 63 lowercase letters, digits or hyphens starting with a letter", req.GetParent()))
	}
	if !resource.ValidID(req.GetAgentId()) {
		v.Add("agent_id", fmt.Sprintf("%q must be 1 to 63 lowercase letters, digits or hyphens, starting with a letter", req.GetAgentId()))
	}
	in := req.GetAgent()
	if in == nil {
		v.Add("agent", "is required")
		in = &registryv1.Agent{}
	}
	checkAgentFields(&v, in, mutableAgentPaths)
	key := requestKey(&v, "CreateAgent", req.GetParent()+"/agents/"+req.GetAgentId(), req.GetRequestId())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	now := timestamppb.New(s.now())
	a := &registryv1.Agent{
		Name:          store.AgentPrefix(client) + req.GetAgentId(),
		DisplayName:   in.GetDisplayName(),
		Description:   in.GetDescription(),
		CreateTime:    now,
		UpdateTime:    now,
		SupportPolicy: in.GetSupportPolicy(),
		Dialect:       in.GetDialect(),
		Owner:         in.GetOwner(),

		AgentProtocolAccess: in.GetAgentProtocolAccess(),
	}
	secret, first, err := s.newKey(a.GetName(), auth.Agent)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	created, err := s.store.CreateAgent(ctx, a, &first, key)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	// A replayed request id returns the first result and stores no key;
	// the first key's secret went out with that first result only.
	if _, err := s.store.GetKeyByID(ctx, first.ID); err == nil {
		created = proto.Clone(created).(*registryv1.Agent)
		created.InitialKey = withSecret(first.Key, secret)
	}
	return created, nil
}

// mutableAgentPaths are the Agent fields UpdateAgent may change, as
// update_mask paths.
var mutableAgentPaths = []string{"display_name", "description", "support_policy", "dialect", "owner", "agent_protocol_access"}

// ignoredAgentPaths are Agent fields an update_mask may name but that
// UpdateAgent never changes: the identifier, the etag (a precondition) and
// output-only fields. The gateway puts them in the mask when a client
// PATCHes back a whole Agent it read.
var ignoredAgentPaths = map[string]bool{
	"name": true, "etag": true, "create_time": true, "update_time": true,
	"supported_protocols": true, "unsupported_protocols": true, "initial_key": true,
}

// checkAgentFields validates the values of in's fields named by paths.
func checkAgentFields(v *grpcerr.Violations, in *registryv1.Agent, paths []string) {
	for _, p := range paths {
		switch p {
		case "display_name":
			if n := utf8.RuneCountInString(in.GetDisplayName()); n > maxDisplayName {
				v.Add("agent.display_name", fmt.Sprintf("has %d characters, at most %d allowed", n, maxDisplayName))
			}
		case "description":
			if n := utf8.RuneCountInString(in.GetDescription()); n > maxDescription {
				v.Add("agent.description", fmt.Sprintf("has %d characters, at most %d allowed", n, maxDescription))
			}
		case "support_policy":
			if _, ok := registryv1.SupportPolicy_name[int32(in.GetSupportPolicy())]; !ok {
				v.Add("agent.support_policy", fmt.Sprintf("%d is not a SupportPolicy", in.GetSupportPolicy()))
			}
		case "dialect":
			if _, ok := registryv1.Dialect_name[int32(in.GetDialect())]; !ok {
				v.Add("agent.dialect", fmt.Sprintf("%d is not a Dialect", in.GetDialect()))
			}
		case "owner":
			checkOwner(v, in.GetOwner())
		case "agent_protocol_access":
			if _, ok := registryv1.AgentProtocolAccess_name[int32(in.GetAgentProtocolAccess())]; !ok {
				v.Add("agent.agent_protocol_access", fmt.Sprintf("%d is not an AgentProtocolAccess", in.GetAgentProtocolAccess()))
			}
		}
	}
}

// requestKey validates an AIP-155 request id and returns the store's key
// for it, scoped to the method and the resource acted on, so that one id
// cannot replay another call's result; "" when there is no id.
func requestKey(v *grpcerr.Violations, method, resource, id string) string {
	if id == "" {
		return ""
	}
	if len(id) > maxRequestID {
		v.Add("request_id", fmt.Sprintf("has %d bytes, at most %d allowed", len(id), maxRequestID))
	}
	return method + " " + resource + " " + id
}

// updatePaths resolves UpdateAgent's mask to mutable paths: "*" means all
// of them, an empty mask those set (non-zero) in in. Ignored paths are
// dropped; any other path is a violation.
func updatePaths(v *grpcerr.Violations, in *registryv1.Agent, mask []string) []string {
	if len(mask) == 0 {
		var paths []string
		if in.GetDisplayName() != "" {
			paths = append(paths, "display_name")
		}
		if in.GetDescription() != "" {
			paths = append(paths, "description")
		}
		if in.GetSupportPolicy() != registryv1.SupportPolicy_SUPPORT_POLICY_UNSPECIFIED {
			paths = append(paths, "support_policy")
		}
		if in.GetDialect() != registryv1.Dialect_DIALECT_UNSPECIFIED {
			paths = append(paths, "dialect")
		}
		if in.GetOwner() != nil {
			paths = append(paths, "owner")
		}
		if in.GetAgentProtocolAccess() != registryv1.AgentProtocolAccess_AGENT_PROTOCOL_ACCESS_UNSPECIFIED {
			paths = append(paths, "agent_protocol_access")
		}
		return paths
	}
	var paths []string
	for i, p := range mask {
		switch {
		case p == "*":
			if len(mask) > 1 {
				v.Add(fmt.Sprintf("update_mask.paths[%d]", i), `"*" must be the only path`)
			}
			return mutableAgentPaths
		case slices.Contains(mutableAgentPaths, p):
			if !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		case ignoredAgentPaths[strings.SplitN(p, ".", 2)[0]]:
		default:
			v.Add(fmt.Sprintf("update_mask.paths[%d]", i), fmt.Sprintf("%q is not a field UpdateAgent can change; use %s or *", p, strings.Join(mutableAgentPaths, ", ")))
		}
	}
	return paths
}

// UpdateAgent implements RegistryService.
func (s *Server) UpdateAgent(ctx context.Context, req *registryv1.UpdateAgentRequest) (*registryv1.Agent, error) {
	var v grpcerr.Violations
	in := req.GetAgent()
	if in == nil {
		v.Add("agent", "is required")
		in = &registryv1.Agent{}
	}
	checkAgentName(&v, "agent.name", in.GetName())
	paths := updatePaths(&v, in, req.GetUpdateMask().GetPaths())
	checkAgentFields(&v, in, paths)
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	return s.updateAgent(ctx, in.GetName(), "", func(a *registryv1.Agent) error {
		if in.GetEtag() != "" && in.GetEtag() != a.GetEtag() {
			return grpcerr.New(codes.Aborted,
				fmt.Sprintf("agent %s changed since it was read (etag %q, now %q); read it again and reapply the change", a.GetName(), in.GetEtag(), a.GetEtag()),
				reasonEtagMismatch, Domain, map[string]string{"agent": a.GetName(), "etag": a.GetEtag()})
		}
		for _, p := range paths {
			switch p {
			case "display_name":
				a.DisplayName = in.GetDisplayName()
			case "description":
				a.Description = in.GetDescription()
			case "support_policy":
				a.SupportPolicy = in.GetSupportPolicy()
			case "dialect":
				a.Dialect = in.GetDialect()
			case "owner":
				a.Owner = in.GetOwner()
			case "agent_protocol_access":
				a.AgentProtocolAccess = in.GetAgentProtocolAccess()
			}
		}
		return nil
	})
}

// GetAgent implements RegistryService.
func (s *Server) GetAgent(ctx context.Context, req *registryv1.GetAgentRequest) (*registryv1.Agent, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	a, err := s.store.GetAgent(ctx, req.GetName())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return a, nil
}

// ListAgents implements RegistryService.
func (s *Server) ListAgents(ctx context.Context, req *registryv1.ListAgentsRequest) (*registryv1.ListAgentsResponse, error) {
	var v grpcerr.Violations
	client, ok := strings.CutPrefix(req.GetParent(), "clients/")
	if !ok || (client != "-" && !resource.ValidID(client)) {
		v.Add("parent", fmt.Sprintf("%q must have the form clients/{client} or clients/-", req.GetParent()))
	}
	if client == "-" {
		client = ""
	}
	size, ok := pagetoken.Size(req.GetPageSize(), 50, 1000)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	after, err := pagetoken.Decode(req.GetPageToken(), "agents", req.GetParent())
	if err != nil {
		v.Add("page_token", "is not a token from this list with these parameters")
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	agents, err := s.store.ListAgents(ctx, store.ListOptions{Client: client, After: after, Limit: size + 1})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &registryv1.ListAgentsResponse{Agents: agents}
	if len(agents) > size {
		resp.Agents = agents[:size]
		resp.NextPageToken = pagetoken.Encode(agents[size-1].GetName(), "agents", req.GetParent())
	}
	return resp, nil
}

// DeleteAgent implements RegistryService.
func (s *Server) DeleteAgent(ctx context.Context, req *registryv1.DeleteAgentRequest) (*emptypb.Empty, error) {
	var v grpcerr.Violations
	checkAgentName(&v, "name", req.GetName())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	if err := s.store.DeleteAgent(ctx, req.GetName()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &emptypb.Empty{}, nil
}

// AddSupportedProtocol implements RegistryService.
func (s *Server) AddSupportedProtocol(ctx context.Context, req *registryv1.AddSupportedProtocolRequest) (*registryv1.Agent, error) {
	var v grpcerr.Violations
	h, herr := checkAgentAndProtocol(&v, req.GetName(), req.GetProtocol())
	key := requestKey(&v, "AddSupportedProtocol", req.GetName(), req.GetRequestId())
	if len(req.GetSources()) > maxSourcesPerPD {
		v.Add("sources", fmt.Sprintf("has %d entries, at most %d allowed", len(req.GetSources()), maxSourcesPerPD))
	}
	for i, src := range req.GetSources() {
		if msg := s.checkSource(src, h, herr == nil); msg != "" {
			v.Add(fmt.Sprintf("sources[%d]", i), msg)
		}
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	sources := req.GetSources()
	if len(sources) == 0 {
		sources = []string{s.ProtocolURL(h)}
	}
	// The document must be known here, so that discovery can name it and
	// the dispatcher can resolve it without a fetch.
	if _, err := s.resolve(ctx, h, req.GetSources()); err != nil {
		var nf *resolve.NotFoundError
		if errors.As(err, &nf) && grpcerr.Reason(resolveStatus(nf)) != reasonFetchBusy {
			return nil, grpcerr.New(codes.FailedPrecondition, "protocol "+h.Hex()+" is not stored and no source produced it; register it first or give a source ("+nf.Error()+")", reasonProtocolMissing, Domain, map[string]string{"protocol": h.Hex()})
		}
		return nil, s.toStatus(ctx, err)
	}
	return s.updateAgent(ctx, req.GetName(), key, func(a *registryv1.Agent) error {
		ref := "protocols/" + h.Hex()
		a.SupportedProtocols = removeProtocol(a.SupportedProtocols, ref)
		a.UnsupportedProtocols = removeProtocol(a.UnsupportedProtocols, ref)
		if len(a.SupportedProtocols) >= maxProtocolsInAList {
			return grpcerr.New(codes.ResourceExhausted, fmt.Sprintf("agent %s already supports %d protocols, the most allowed", a.GetName(), maxProtocolsInAList), reasonTooManyProtocols, Domain, nil)
		}
		a.SupportedProtocols = append(a.SupportedProtocols, &registryv1.SupportedProtocol{Protocol: ref, Sources: sources})
		return nil
	})
}

// checkSource returns why src cannot be advertised as a source of h, or "".
// A data: URI is decoded and must hold the document itself.
func (s *Server) checkSource(src string, h pd.Hash, checkHash bool) string {
	if strings.HasPrefix(src, "data:") {
		b, err := fetch.DecodeData(src, s.opts.MaxBytes)
		if err != nil {
			return err.Error()
		}
		if checkHash && pd.Sum(b) != h {
			return "data: URI holds a document with SHA-1 " + pd.Sum(b).Hex() + ", not the protocol"
		}
		return ""
	}
	if len(src) > maxSourceURL {
		return fmt.Sprintf("URL has %d characters, at most %d allowed", len(src), maxSourceURL)
	}
	u, err := url.Parse(src)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return fmt.Sprintf("%q must be an absolute http(s) URL without credentials, or a data: URI", fetch.Describe(src))
	}
	return ""
}

// RemoveSupportedProtocol implements RegistryService.
func (s *Server) RemoveSupportedProtocol(ctx context.Context, req *registryv1.RemoveSupportedProtocolRequest) (*registryv1.Agent, error) {
	var v grpcerr.Violations
	h, _ := checkAgentAndProtocol(&v, req.GetName(), req.GetProtocol())
	key := requestKey(&v, "RemoveSupportedProtocol", req.GetName(), req.GetRequestId())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	return s.updateAgent(ctx, req.GetName(), key, func(a *registryv1.Agent) error {
		a.SupportedProtocols = removeProtocol(a.SupportedProtocols, "protocols/"+h.Hex())
		return nil
	})
}

// AddUnsupportedProtocol implements RegistryService.
func (s *Server) AddUnsupportedProtocol(ctx context.Context, req *registryv1.AddUnsupportedProtocolRequest) (*registryv1.Agent, error) {
	var v grpcerr.Violations
	h, _ := checkAgentAndProtocol(&v, req.GetName(), req.GetProtocol())
	key := requestKey(&v, "AddUnsupportedProtocol", req.GetName(), req.GetRequestId())
	if n := utf8.RuneCountInString(req.GetComment()); n > maxComment {
		v.Add("comment", fmt.Sprintf("has %d characters, at most %d allowed", n, maxComment))
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	return s.updateAgent(ctx, req.GetName(), key, func(a *registryv1.Agent) error {
		ref := "protocols/" + h.Hex()
		a.SupportedProtocols = removeProtocol(a.SupportedProtocols, ref)
		a.UnsupportedProtocols = removeProtocol(a.UnsupportedProtocols, ref)
		if len(a.UnsupportedProtocols) >= maxProtocolsInAList {
			return grpcerr.New(codes.ResourceExhausted, fmt.Sprintf("agent %s already lists %d unsupported protocols, the most allowed", a.GetName(), maxProtocolsInAList), reasonTooManyProtocols, Domain, nil)
		}
		a.UnsupportedProtocols = append(a.UnsupportedProtocols, &registryv1.UnsupportedProtocol{Protocol: ref, Comment: req.GetComment()})
		return nil
	})
}

// RemoveUnsupportedProtocol implements RegistryService.
func (s *Server) RemoveUnsupportedProtocol(ctx context.Context, req *registryv1.RemoveUnsupportedProtocolRequest) (*registryv1.Agent, error) {
	var v grpcerr.Violations
	h, _ := checkAgentAndProtocol(&v, req.GetName(), req.GetProtocol())
	key := requestKey(&v, "RemoveUnsupportedProtocol", req.GetName(), req.GetRequestId())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	return s.updateAgent(ctx, req.GetName(), key, func(a *registryv1.Agent) error {
		a.UnsupportedProtocols = removeProtocol(a.UnsupportedProtocols, "protocols/"+h.Hex())
		return nil
	})
}

// checkAgentAndProtocol validates an agent name and a protocol hash (either
// form, or protocols/{hash}), adding violations to v.
func checkAgentAndProtocol(v *grpcerr.Violations, name, protocol string) (pd.Hash, error) {
	checkAgentName(v, "name", name)
	h, err := pd.ParseHash(strings.TrimPrefix(protocol, "protocols/"))
	if err != nil {
		v.Add("protocol", err.Error())
	}
	return h, err
}

// updateAgent applies mutate to the stored agent in one store transaction
// and stamps its update time; key is the request id's key or "". The
// support methods' mutations first remove the protocol from both lists, so
// a protocol is never both supported and unsupported.
func (s *Server) updateAgent(ctx context.Context, name, key string, mutate func(*registryv1.Agent) error) (*registryv1.Agent, error) {
	a, err := s.store.UpdateAgent(ctx, name, key, func(a *registryv1.Agent) error {
		if err := mutate(a); err != nil {
			return err
		}
		a.UpdateTime = timestamppb.New(s.now())
		return nil
	})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return a, nil
}

func removeProtocol[T interface {
	proto.Message
	GetProtocol() string
}](list []T, ref string) []T {
	out := list[:0]
	for _, e := range list {
		if e.GetProtocol() != ref {
			out = append(out, e)
		}
	}
	return out
}
