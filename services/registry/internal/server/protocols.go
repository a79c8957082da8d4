package server

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/services/registry/internal/pd"
	"github.com/parleyhq/parley/services/registry/internal/resolve"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// errPeerTooLarge reports a peer's document over this registry's limit.
var errPeerTooLarge = errors.New("document too large")

// Origin of documents registered through CreateProtocol.
const originAPI = "api"

// CreateProtocol implements RegistryService.
func (s *Server) CreateProtocol(ctx context.Context, req *registryv1.CreateProtocolRequest) (*registryv1.Protocol, error) {
	var v grpcerr.Violations
	switch {
	case req.GetProtocol() == nil:
		v.Add("protocol", "is required")
	case len(req.GetProtocol().GetContent()) == 0:
		v.Add("protocol.content", "must not be empty")
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	content := req.GetProtocol().GetContent()
	if err := s.checkSize(len(content), "protocol.content"); err != nil {
		return nil, err
	}
	p, _, err := s.register(ctx, content, originAPI, "protocol.content")
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return p, nil
}

func (s *Server) checkSize(n int, field string) error {
	if int64(n) <= s.opts.MaxBytes {
		return nil
	}
	return grpcerr.New(codes.ResourceExhausted,
		fmt.Sprintf("%s is %d bytes, over the %d-byte limit for protocol documents", field, n, s.opts.MaxBytes),
		reasonTooLarge, Domain, map[string]string{"field": field, "limit_bytes": fmt.Sprint(s.opts.MaxBytes)})
}

// register parses, hashes and stores content exactly as given. field names
// the request field that carried it, for metadata errors. It is idempotent:
// registering stored bytes returns the stored protocol.
func (s *Server) register(ctx context.Context, content []byte, origin, field string) (*registryv1.Protocol, bool, error) {
	h, sum256 := pd.Sum(content), sha256Hex(content)
	if p := s.cache.get(h); p != nil && p.GetSha256Hex() == sum256 {
		return p, false, nil
	}
	md, err := pd.Parse(content, pd.Options{Strict: s.opts.Strict})
	if err != nil {
		return nil, false, &metadataError{field: field, err: err}
	}
	p := &registryv1.Protocol{
		Name:               "protocols/" + h.Hex(),
		Content:            content,
		Sha1Hex:            h.Hex(),
		Sha1Base64:         h.Base64(),
		Sha256Hex:          sum256,
		Title:              md.Name,
		Description:        md.Description,
		Multiround:         md.Multiround,
		Tags:               md.Tags,
		SizeBytes:          int64(len(content)),
		Origin:             origin,
		CreateTime:         timestamppb.New(s.now()),
		RequestSchemaJson:  md.RequestSchemaJSON,
		ResponseSchemaJson: md.ResponseSchemaJSON,
		StateMachine:       stateMachineProto(md.StateMachine),
	}
	stored, created, err := s.store.CreateProtocol(ctx, p)
	if err != nil {
		return nil, false, err
	}
	if created {
		s.metrics.stored.WithLabelValues(via(origin)).Inc()
	}
	s.cache.put(h, stored)
	return stored, created, nil
}

func via(origin string) string {
	switch {
	case origin == originAPI:
		return "api"
	case strings.HasPrefix(origin, "peer:"):
		return "peer"
	default:
		return "source"
	}
}

func sha256Hex(b []byte) string {
	sum := pd.Sum256(b)
	return hex.EncodeToString(sum[:])
}

var outcomeProto = map[pd.Outcome]registryv1.StateMachineOutcome{
	pd.OutcomeSuccess: registryv1.StateMachineOutcome_STATE_MACHINE_OUTCOME_SUCCESS,
	pd.OutcomeFailure: registryv1.StateMachineOutcome_STATE_MACHINE_OUTCOME_FAILURE,
}

func stateMachineProto(sm *pd.StateMachine) *registryv1.StateMachine {
	if sm == nil {
		return nil
	}
	out := &registryv1.StateMachine{Roles: sm.Roles, Initial: sm.Initial, Terminal: sm.Terminal, TypeField: sm.TypeField, AlwaysAllowed: sm.AlwaysAllowed}
	for _, m := range sm.Messages {
		pm := &registryv1.StateMachineMessage{
			Type: m.Type, SenderRole: m.Senders[0], SenderRoles: m.Senders, ReceiverRole: m.Receiver,
			SchemaJson: m.SchemaJSON, Answers: m.Answers, Outcome: outcomeProto[m.Outcome], OpensOrder: m.OpensOrder,
		}
		for _, d := range m.Deadlines {
			dl := &registryv1.StateMachineDeadline{Name: d.Name, Field: d.Field, Guards: d.Guards}
			if d.Max > 0 {
				dl.Max = durationpb.New(d.Max)
			}
			pm.Deadlines = append(pm.Deadlines, dl)
		}
		out.Messages = append(out.Messages, pm)
	}
	for _, t := range sm.Transitions {
		tr := &registryv1.StateMachineTransition{Message: t.Message, Next: t.Next}
		if t.Deadline > 0 {
			tr.Deadline = durationpb.New(t.Deadline)
		}
		out.Transitions = append(out.Transitions, tr)
	}
	return out
}

// parseProtocolRef accepts a hash in either form, or protocols/{hash}.
func parseProtocolRef(field, ref string) (pd.Hash, error) {
	h, err := pd.ParseHash(strings.TrimPrefix(ref, "protocols/"))
	if err != nil {
		var v grpcerr.Violations
		v.Add(field, err.Error())
		return h, v.Err(reasonInvalidArgument, Domain)
	}
	return h, nil
}

// stored returns a stored protocol from the cache or the store.
func (s *Server) stored(ctx context.Context, h pd.Hash) (*registryv1.Protocol, error) {
	if p := s.cache.get(h); p != nil {
		return p, nil
	}
	p, err := s.store.GetProtocol(ctx, h)
	if err != nil {
		return nil, err
	}
	s.cache.put(h, p)
	return p, nil
}

// GetProtocol implements RegistryService. The returned message may be shared
// with the cache: callers must not modify it.
func (s *Server) GetProtocol(ctx context.Context, req *registryv1.GetProtocolRequest) (*registryv1.Protocol, error) {
	if !strings.HasPrefix(req.GetName(), "protocols/") {
		var v grpcerr.Violations
		v.Add("name", fmt.Sprintf("%q must have the form protocols/{hash}", req.GetName()))
		return nil, v.Err(reasonInvalidArgument, Domain)
	}
	h, err := parseProtocolRef("name", req.GetName())
	if err != nil {
		return nil, err
	}
	p, err := s.stored(ctx, h)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return p, nil
}

// ListProtocols implements RegistryService.
func (s *Server) ListProtocols(ctx context.Context, req *registryv1.ListProtocolsRequest) (*registryv1.ListProtocolsResponse, error) {
	protocols, next, err := s.listProtocols(ctx, req.GetPageSize(), req.GetPageToken(), "")
	if err != nil {
		return nil, err
	}
	return &registryv1.ListProtocolsResponse{Protocols: protocols, NextPageToken: next}, nil
}

// SearchProtocols implements RegistryService.
func (s *Server) SearchProtocols(ctx context.Context, req *registryv1.SearchProtocolsRequest) (*registryv1.SearchProtocolsResponse, error) {
	if strings.TrimSpace(req.GetQuery()) == "" {
		var v grpcerr.Violations
		v.Add("query", "must not be empty")
		return nil, v.Err(reasonInvalidArgument, Domain)
	}
	protocols, next, err := s.listProtocols(ctx, req.GetPageSize(), req.GetPageToken(), req.GetQuery())
	if err != nil {
		return nil, err
	}
	return &registryv1.SearchProtocolsResponse{Protocols: protocols, NextPageToken: next}, nil
}

func (s *Server) listProtocols(ctx context.Context, pageSize int32, token, query string) ([]*registryv1.Protocol, string, error) {
	var v grpcerr.Violations
	size, ok := pagetoken.Size(pageSize, 50, 1000)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	after, err := pagetoken.Decode(token, "protocols", query)
	if err != nil {
		v.Add("page_token", "is not a token from this list with these parameters")
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, "", err
	}
	protocols, err := s.store.ListProtocols(ctx, store.ListOptions{After: after, Limit: size + 1, Query: query})
	if err != nil {
		return nil, "", s.toStatus(ctx, err)
	}
	next := ""
	if len(protocols) > size {
		protocols = protocols[:size]
		next = pagetoken.Encode(protocols[size-1].GetSha1Hex(), "protocols", query)
	}
	return protocols, next, nil
}

// ResolveProtocol implements RegistryService. The returned message may be
// shared with the cache: callers must not modify it.
func (s *Server) ResolveProtocol(ctx context.Context, req *registryv1.ResolveProtocolRequest) (*registryv1.Protocol, error) {
	h, err := parseProtocolRef("hash", req.GetHash())
	if err != nil {
		return nil, err
	}
	p, err := s.resolve(ctx, h, req.GetSources())
	if err != nil {
		s.metrics.resolves.WithLabelValues("failed").Inc()
		return nil, s.toStatus(ctx, err)
	}
	return p, nil
}

// resolve returns the stored protocol h or finds, verifies and stores it.
// Concurrent calls for one hash share a single resolution, which runs on
// its own time budget (ResolveTimeout, for peers and every source
// together) so that one impatient caller does not fail the others; each
// caller still stops waiting when its own context ends. The resolution
// stops when the server's Context ends.
func (s *Server) resolve(ctx context.Context, h pd.Hash, sources []string) (*registryv1.Protocol, error) {
	p, err := s.stored(ctx, h)
	if err == nil {
		s.metrics.resolves.WithLabelValues("stored").Inc()
		return p, nil
	}
	if !isNotFound(err) {
		return nil, err
	}
	if s.opts.Finder == nil {
		return nil, &resolve.NotFoundError{Hash: h}
	}
	sources = append([]string(nil), sources...)
	// A caller that joined another caller's failed resolution (made with
	// that caller's sources) tries once more, so that bad sources sent by
	// one peer cannot fail everyone resolving the same hash. Sources that
	// just failed are in the negative cache and are not fetched again.
	for attempt := 0; ; attempt++ {
		ch := s.flight.DoChan(string(h[:]), func() (any, error) { return s.resolveShared(ctx, h, sources) })
		s.resolves.Add(1)
		select {
		case r := <-ch:
			s.resolves.Add(-1)
			if r.Err == nil {
				return r.Val.(*registryv1.Protocol), nil
			}
			if !r.Shared || attempt > 0 {
				return nil, r.Err
			}
		case <-ctx.Done():
			s.resolves.Add(-1)
			return nil, ctx.Err()
		}
	}
}

// resolveShared is one resolution of h, shared by every caller waiting on
// it: peers, then sources, then the store.
func (s *Server) resolveShared(ctx context.Context, h pd.Hash, sources []string) (any, error) {
	if !s.begin() {
		return nil, errClosed
	}
	defer s.running.Done()
	// The first caller's values (trace, log attributes), not its deadline.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ResolveTimeout)
	defer cancel()
	defer context.AfterFunc(s.opts.Context, cancel)()
	if p, err := s.stored(fctx, h); err == nil {
		return p, nil
	}
	found, err := s.opts.Finder.Find(fctx, h, sources)
	if err != nil {
		if s.opts.Context.Err() != nil {
			return nil, errClosed
		}
		return nil, err
	}
	if int64(len(found.Content)) > s.opts.MaxBytes {
		return nil, fmt.Errorf("%s served %d bytes, over the %d-byte limit: %w", found.Origin, len(found.Content), s.opts.MaxBytes, errPeerTooLarge)
	}
	field := "peer " + strings.TrimPrefix(found.Origin, "peer:")
	if found.Source >= 0 {
		field = fmt.Sprintf("sources[%d]", found.Source)
	}
	p, _, err := s.register(fctx, found.Content, found.Origin, field)
	if err != nil {
		return nil, err
	}
	s.metrics.resolves.WithLabelValues(via(found.Origin)).Inc()
	return p, nil
}

// SyncProtocols implements RegistryService.
func (s *Server) SyncProtocols(ctx context.Context, req *registryv1.SyncProtocolsRequest) (*registryv1.SyncProtocolsResponse, error) {
	names := []string{req.GetPeer()}
	if req.GetPeer() == "" {
		names = names[:0]
		for n := range s.opts.Peers {
			names = append(names, n)
		}
	} else if _, ok := s.opts.Peers[req.GetPeer()]; !ok {
		var v grpcerr.Violations
		v.Add("peer", fmt.Sprintf("%q is not one of the configured --registry-peers", req.GetPeer()))
		return nil, v.Err(reasonPeerNotConfigured, Domain)
	}
	resp := &registryv1.SyncProtocolsResponse{}
	for _, name := range names {
		if err := s.syncFrom(ctx, name, s.opts.Peers[name], resp); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// SyncPeer copies the protocols missing here from the configured peer
// called name: SyncProtocols for one peer, which the app's periodic sync
// runs too.
func (s *Server) SyncPeer(ctx context.Context, name string) (*registryv1.SyncProtocolsResponse, error) {
	peer, ok := s.opts.Peers[name]
	if !ok {
		return nil, fmt.Errorf("%q is not one of the configured --registry-peers", name)
	}
	resp := &registryv1.SyncProtocolsResponse{}
	if err := s.syncFrom(ctx, name, peer, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

const maxSyncFailures = 100

func (s *Server) syncFrom(ctx context.Context, name string, peer registryv1.RegistryServiceClient, resp *registryv1.SyncProtocolsResponse) error {
	fail := func(format string, args ...any) {
		if len(resp.Failures) < maxSyncFailures {
			resp.Failures = append(resp.Failures, fmt.Sprintf(format, args...))
		}
	}
	token := ""
	for {
		page, err := peer.ListProtocols(ctx, &registryv1.ListProtocolsRequest{PageSize: 1000, PageToken: token})
		if err != nil {
			return s.peerStatus(ctx, name, err)
		}
		for _, meta := range page.GetProtocols() {
			h, err := pd.ParseHash(meta.GetSha1Hex())
			if err != nil {
				fail("peer %s listed a malformed hash %q", name, meta.GetSha1Hex())
				continue
			}
			if have, err := s.stored(ctx, h); err == nil {
				if have.GetSha256Hex() != meta.GetSha256Hex() {
					fail("protocol %s: peer %s holds other bytes (SHA-256 %s, ours %s)", h.Hex(), name, meta.GetSha256Hex(), have.GetSha256Hex())
					continue
				}
				resp.PresentCount++
				continue
			}
			full, err := peer.GetProtocol(ctx, &registryv1.GetProtocolRequest{Name: "protocols/" + h.Hex()})
			if err != nil {
				fail("protocol %s: peer %s: %v", h.Hex(), name, err)
				continue
			}
			content := full.GetContent()
			switch {
			case pd.Sum(content) != h:
				fail("protocol %s: peer %s served bytes that fail the SHA-1 check", h.Hex(), name)
				continue
			case int64(len(content)) > s.opts.MaxBytes:
				fail("protocol %s: %d bytes, over the %d-byte limit", h.Hex(), len(content), s.opts.MaxBytes)
				continue
			}
			if _, created, err := s.register(ctx, content, "peer:"+name, "content"); err != nil {
				fail("protocol %s: %v", h.Hex(), err)
			} else if created {
				resp.CopiedCount++
			} else {
				resp.PresentCount++
			}
		}
		token = page.GetNextPageToken()
		if token == "" {
			return nil
		}
	}
}

func (s *Server) peerStatus(ctx context.Context, name string, err error) error {
	if ctx.Err() != nil {
		return s.toStatus(ctx, ctx.Err())
	}
	return grpcerr.New(codes.Unavailable, "peer registry "+name+" is unavailable: "+err.Error(), reasonPeerUnavailable, Domain, map[string]string{"peer": name})
}

// isNotFound reports a store miss.
func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
