package server

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/emptypb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// keyOwnerPattern matches a key's owner: a client or an agent; keyPattern a
// key's name. Ids follow idPattern; key ids are 16 lowercase hex digits.
var (
	keyOwnerPattern = regexp.MustCompile(`^clients/[a-z]([a-z0-9-]{0,61}[a-z0-9])?(/agents/[a-z]([a-z0-9-]{0,61}[a-z0-9])?)?$`)
	keyPattern      = regexp.MustCompile(`^(clients/[a-z]([a-z0-9-]{0,61}[a-z0-9])?(/agents/[a-z]([a-z0-9-]{0,61}[a-z0-9])?)?)/keys/[0-9a-f]{16}$`)
)

func checkKeyOwner(v *grpcerr.Violations, field, name string) {
	if !keyOwnerPattern.MatchString(name) {
		v.Add(field, fmt.Sprintf("%q must have the form clients/{client} or clients/{client}/agents/{agent}", name))
	}
}

func checkKeyName(v *grpcerr.Violations, field, name string) {
	if !keyPattern.MatchString(name) {
		v.Add(field, fmt.Sprintf("%q must have the form clients/{client}/keys/{key} or clients/{client}/agents/{agent}/keys/{key}, the key id 16 lowercase hex digits", name))
	}
}

// ownerKind is the kind of key owner holds: Agent under an agent, else
// Client. Submatch 2 is the whole "/agents/{agent}" part; submatch 3 is
// empty for a one-letter agent id.
func ownerKind(owner string) auth.Kind {
	if keyOwnerPattern.FindStringSubmatch(owner)[2] != "" {
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
