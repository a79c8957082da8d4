package auth

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/parleyhq/parley/platform/grpcerr"
)

// UnaryInterceptor checks every unary call against the policy before its
// handler runs; the handler finds the caller with FromContext.
func (a *Authenticator) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		p, err := a.check(ctx, a.grpcCall(ctx, info.FullMethod, req))
		if err != nil {
			return nil, err
		}
		return h(WithPrincipal(ctx, p), req)
	}
}

// StreamInterceptor checks every streaming call. A rule naming a resource
// is checked against the first request message, before the handler sees
// it. A stream opened with a key is re-verified every Options.Recheck and
// ends with UNAUTHENTICATED once the key is revoked.
func (a *Authenticator) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx := ss.Context()
		c := a.grpcCall(ctx, info.FullMethod, nil)
		rule, ok := a.opts.Policy[info.FullMethod]
		if !ok {
			_, err := a.check(ctx, c) // refuses: no entry
			return err
		}
		// Authenticate and check the caller's kind now; ownership waits
		// for the first message, which names the resource.
		deferred := rule.Resource != ""
		p, err := a.checkRule(ctx, c, Rule{Allow: rule.Allow})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithCancel(WithPrincipal(ctx, p))
		defer cancel()
		w := &authStream{ServerStream: ss, ctx: ctx}
		if deferred {
			w.first = func(m any) error {
				_, err := a.checkRule(ctx, a.grpcCall(ctx, info.FullMethod, m), rule)
				return err
			}
		}
		if p.Key != "" {
			go a.watchKey(ctx, c, cancel, &w.revoked)
		}
		err = h(srv, w)
		if w.revoked.Load() {
			return grpcerr.New(codes.Unauthenticated, "the key was revoked while the stream was open", ReasonInvalid, Domain, nil)
		}
		return err
	}
}

// watchKey verifies the stream's key again every Recheck until ctx ends,
// and cancels the stream when the key is no longer valid.
func (a *Authenticator) watchKey(ctx context.Context, c call, cancel context.CancelFunc, revoked *atomic.Bool) {
	t := time.NewTicker(a.opts.Recheck)
	defer t.Stop()
	token, _ := bearer(c.header)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		v := a.verifier.Load()
		if v == nil {
			continue
		}
		if _, err := (*v).VerifyKey(ctx, token); errors.Is(err, ErrInvalidCredential) {
			a.opts.Logger.WarnContext(ctx, "stream ended: its key was revoked", slog.String("method", c.method))
			revoked.Store(true)
			cancel()
			return
		}
	}
}

// authStream carries the principal's context and checks the first
// message when the rule names a resource.
type authStream struct {
	grpc.ServerStream
	ctx     context.Context
	first   func(m any) error // nil once checked, or when nothing to check
	revoked atomic.Bool
}

func (s *authStream) Context() context.Context { return s.ctx }

func (s *authStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.first != nil {
		check := s.first
		s.first = nil
		return check(m)
	}
	return nil
}

func (a *Authenticator) grpcCall(ctx context.Context, method string, req any) call {
	c := call{method: method, remote: RemoteAddr(ctx), verifiedPeer: verifiedPeer(ctx)}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			c.header = v[0]
		}
		if v := md.Get(ForwardedCallerHeader); len(v) > 0 {
			c.forwarded = v[0]
		}
	}
	msg, _ := req.(proto.Message)
	c.resource = func(field string) string { return fieldValue(msg, field) }
	return c
}

// fieldValue reads a string field of m by dotted path ("agent.name");
// "" when m is nil or the path does not lead to a string.
func fieldValue(m proto.Message, path string) string {
	if m == nil {
		return ""
	}
	r := m.ProtoReflect()
	parts := strings.Split(path, ".")
	for i, part := range parts {
		fd := r.Descriptor().Fields().ByName(protoreflect.Name(part))
		if fd == nil || fd.IsList() || fd.IsMap() {
			return ""
		}
		if i == len(parts)-1 {
			if fd.Kind() != protoreflect.StringKind {
				return ""
			}
			return r.Get(fd).String()
		}
		if fd.Message() == nil || !r.Has(fd) {
			return ""
		}
		r = r.Get(fd).Message()
	}
	return ""
}
