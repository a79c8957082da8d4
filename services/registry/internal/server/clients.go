package server

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// checkClientName adds a violation on field unless name is clients/{client}.
func checkClientName(v *grpcerr.Violations, field, name string) {
	id, ok := strings.CutPrefix(name, "clients/")
	if !ok || !resource.ValidID(id) {
		v.Add(field, fmt.Sprintf("%q must have the form clients/{client}, the id 1 to 63 lowercase letters, digits or hyphens starting with a letter", name))
	}
}

// CreateClient implements RegistryService. Who may create clients is decided
// here, not in the policy table alone, because it depends on
// --open-registration: the operator always, anyone else only with open
// registration and within the registration rate limit.
func (s *Server) CreateClient(ctx context.Context, req *registryv1.CreateClientRequest) (*registryv1.CreateClientResponse, error) {
	// Without access control (no principal) anyone may, as with every
	// other call; ListClientGroupMembers reads "no principal" the same way.
	if p, ok := auth.FromContext(ctx); ok && p.Kind != auth.Operator {
		if !s.opts.OpenRegistration {
			return nil, grpcerr.New(codes.PermissionDenied, "only the operator may create clients on this registry (it runs without --open-registration): call with the operator token", reasonRegistrationClosed, Domain, nil)
		}
		if !s.registrations.Allow(ctx, auth.RemoteAddr(ctx)) {
			return nil, grpcerr.New(codes.ResourceExhausted, "too many clients created from this address; try again in a minute", reasonRegistrationLimit, Domain, nil)
		}
	}
	var v grpcerr.Violations
	if !resource.ValidID(req.GetClientId()) {
		v.Add("client_id", fmt.Sprintf("%q must be 1 to 63 lowercase letters, digits or hyphens, starting with a letter", req.GetClientId()))
	}
	if n := utf8.RuneCountInString(req.GetClient().GetDisplayName()); n > maxDisplayName {
		v.Add("client.display_name", fmt.Sprintf("has %d characters, at most %d allowed", n, maxDisplayName))
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	c := &registryv1.Client{
		Name:        "clients/" + req.GetClientId(),
		DisplayName: req.GetClient().GetDisplayName(),
		CreateTime:  timestamppb.New(s.now()),
	}
	secret, first, err := s.newKey(c.GetName(), auth.Client)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	created, err := s.store.CreateClient(ctx, c, first)
	if isAlreadyExists(err) {
		return nil, grpcerr.New(codes.AlreadyExists, "client "+c.GetName()+" already exists", reasonClientExists, Domain, map[string]string{"client": c.GetName()})
	}
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &registryv1.CreateClientResponse{Client: created, Key: withSecret(first.Key, secret)}, nil
}

// GetClient implements RegistryService.
func (s *Server) GetClient(ctx context.Context, req *registryv1.GetClientRequest) (*registryv1.Client, error) {
	var v grpcerr.Violations
	checkClientName(&v, "name", req.GetName())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	c, err := s.store.GetClient(ctx, req.GetName())
	if isNotFound(err) {
		return nil, grpcerr.New(codes.NotFound, "client "+req.GetName()+" does not exist", reasonClientNotFound, Domain, map[string]string{"client": req.GetName()})
	}
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return c, nil
}

// ListClients implements RegistryService.
func (s *Server) ListClients(ctx context.Context, req *registryv1.ListClientsRequest) (*registryv1.ListClientsResponse, error) {
	var v grpcerr.Violations
	size, ok := pagetoken.Size(req.GetPageSize(), 50, 1000)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	after, err := pagetoken.Decode(req.GetPageToken(), "clients", "")
	if err != nil {
		v.Add("page_token", "is not a token from this list")
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	clients, err := s.store.ListClients(ctx, store.ListOptions{After: after, Limit: size + 1})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &registryv1.ListClientsResponse{}
	if len(clients) > size {
		clients = clients[:size]
		resp.NextPageToken = pagetoken.Encode(clients[size-1].GetName(), "clients", "")
	}
	resp.Clients = clients
	return resp, nil
}

// newKey makes a key of kind for owner: the secret, to be returned once,
// and what the store keeps.
func (s *Server) newKey(owner string, kind auth.Kind) (string, store.StoredKey, error) {
	secret, id, hash, err := auth.NewKey(kind)
	if err != nil {
		return "", store.StoredKey{}, err
	}
	return secret, store.StoredKey{
		Key:  &registryv1.Key{Name: owner + "/keys/" + id, CreateTime: timestamppb.New(s.now())},
		ID:   id,
		Hash: hash,
	}, nil
}

// withSecret returns a copy of k carrying secret, for the one response that
// may show it.
func withSecret(k *registryv1.Key, secret string) *registryv1.Key {
	out := proto.Clone(k).(*registryv1.Key)
	out.Secret = secret
	return out
}
