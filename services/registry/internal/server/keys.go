package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/emptypb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// validKeyOwner reports whether name is a key's owner, a client
// (clients/{client}) or an agent (resource.ValidAgentName), and whether it
// is an agent.
func validKeyOwner(name string) (ok, agent bool) {
	if resource.ValidAgentName(name) {
		return true, true
	}
	client, found := strings.CutPrefix(name, "clients/")
	return found && resource.ValidID(client), false
}

// validKeyID reports whether id is 16 lowercase hex digits.
func validKeyID(id string) bool {
	if len(id) != 16 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func checkKeyOwner(v *grpcerr.Violations, field, name string) {
	if ok, _ := validKeyOwner(name); !ok {
		v.Add(field, fmt.Sprintf("%q must have the form clients/{client} or clients/{client}/agents/{agent}", name))
	}
}

func checkKeyName(v *grpcerr.Violations, field, name string) {
	owner, id, found := strings.Cut(name, "/keys/")
	if ok, _ := validKeyOwner(owner); !found || !ok || !validKeyID(id) {
		v.Add(field, fmt.Sprintf("%q must have the form clients/{client}/keys/{key} or clients/{client}/agents/{agent}/keys/{key}, the key id 16 lowercase hex digits", name))
	}
}

// ownerKind is the kind of key owner holds: Agent under an agent, else
// Client.
func ownerKind(owner string) auth.Kind {
	if _, agent := validKeyOwner(owner); agent {
		return auth.Agent
	}
	return auth.Client
}

// CreateKey implements RegistryService.
func (s *Server) CreateKey(ctx context.Context, req *registryv1.CreateKeyRequest) (*registryv1.Key, error) {
	var v grpcerr.Violations
	checkKeyOwner(&v, "parent", req.GetParent())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	secret, k, err := s.newKey(req.GetParent(), ownerKind(req.GetParent()))
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	switch err := s.store.CreateKey(ctx, k); {
	case isNotFound(err):
		return nil, grpcerr.New(codes.NotFound, req.GetParent()+" does not exist", reasonKeyOwnerNotFound, Domain, map[string]string{"parent": req.GetParent()})
	case errors.Is(err, store.ErrTooManyKeys):
		return nil, grpcerr.New(codes.ResourceExhausted, fmt.Sprintf("%s already holds %d keys; revoke one first", req.GetParent(), store.MaxKeys), reasonKeyLimit, Domain, map[string]string{"parent": req.GetParent()})
	case err != nil:
		return nil, s.toStatus(ctx, err)
	}
	return withSecret(k.Key, secret), nil
}

// ListKeys implements RegistryService.
func (s *Server) ListKeys(ctx context.Context, req *registryv1.ListKeysRequest) (*registryv1.ListKeysResponse, error) {
	var v grpcerr.Violations
	checkKeyOwner(&v, "parent", req.GetParent())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	keys, err := s.store.ListKeys(ctx, req.GetParent())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &registryv1.ListKeysResponse{Keys: keys}, nil
}

// DeleteKey implements RegistryService.
func (s *Server) DeleteKey(ctx context.Context, req *registryv1.DeleteKeyRequest) (*emptypb.Empty, error) {
	var v grpcerr.Violations
	checkKeyName(&v, "name", req.GetName())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	if err := s.store.DeleteKey(ctx, req.GetName()); err != nil {
		return nil, s.keyNotFound(ctx, err, req.GetName())
	}
	return &emptypb.Empty{}, nil
}

// RotateKey implements RegistryService.
func (s *Server) RotateKey(ctx context.Context, req *registryv1.RotateKeyRequest) (*registryv1.Key, error) {
	var v grpcerr.Violations
	checkKeyName(&v, "name", req.GetName())
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	owner := store.KeyParent(req.GetName())
	secret, k, err := s.newKey(owner, ownerKind(owner))
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if err := s.store.RotateKey(ctx, req.GetName(), k); err != nil {
		return nil, s.keyNotFound(ctx, err, req.GetName())
	}
	return withSecret(k.Key, secret), nil
}

func (s *Server) keyNotFound(ctx context.Context, err error, name string) error {
	if isNotFound(err) {
		return grpcerr.New(codes.NotFound, "key "+name+" does not exist", reasonKeyNotFound, Domain, map[string]string{"key": name})
	}
	return s.toStatus(ctx, err)
}

// IntrospectKey implements RegistryService.
func (s *Server) IntrospectKey(ctx context.Context, req *registryv1.IntrospectKeyRequest) (*registryv1.IntrospectKeyResponse, error) {
	if len(req.GetSecret()) > auth.MaxTokenSize {
		var v grpcerr.Violations
		v.Add("secret", fmt.Sprintf("has %d bytes, at most %d allowed", len(req.GetSecret()), auth.MaxTokenSize))
		return nil, v.Err(reasonInvalidArgument, Domain)
	}
	p, err := s.VerifyKey(ctx, req.GetSecret())
	if errors.Is(err, auth.ErrInvalidCredential) {
		return &registryv1.IntrospectKeyResponse{}, nil
	}
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &registryv1.IntrospectKeyResponse{Active: true, Key: p.Key, Client: p.Client, Agent: p.Agent, Kind: registryv1.PrincipalKind_PRINCIPAL_KIND_CLIENT}
	if p.Kind == auth.Agent {
		resp.Kind = registryv1.PrincipalKind_PRINCIPAL_KIND_AGENT
	}
	return resp, nil
}

// VerifyKey says whom a client or agent key identifies: an auth.Verifier
// over this registry's own store, for the services in its process.
// Unknown, revoked and malformed keys fail with auth.ErrInvalidCredential;
// the error never holds the secret.
func (s *Server) VerifyKey(ctx context.Context, secret string) (auth.Principal, error) {
	kind, id, ok := auth.ParseKey(secret)
	if !ok {
		return auth.Principal{}, auth.ErrInvalidCredential
	}
	k, err := s.store.GetKeyByID(ctx, id)
	if isNotFound(err) {
		return auth.Principal{}, auth.ErrInvalidCredential
	}
	if err != nil {
		return auth.Principal{}, err
	}
	owner := store.KeyParent(k.Key.GetName())
	if !auth.SameHash(k.Hash, auth.HashSecret(secret)) || ownerKind(owner) != kind {
		return auth.Principal{}, auth.ErrInvalidCredential
	}
	p := auth.Principal{Kind: kind, Key: k.Key.GetName(), Client: owner}
	if kind == auth.Agent {
		p.Agent = owner
		p.Client, _, _ = strings.Cut(owner, "/agents/")
	}
	return p, nil
}
