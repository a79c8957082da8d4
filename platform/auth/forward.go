package auth

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// ForwardedCallerHeader is the gRPC metadata key with which one service,
// calling another on behalf of its own caller, names that caller (see
// ForwardedCaller). The receiving service believes it only from a peer
// that authenticated as a service: with the operator token, or with a
// client certificate it verified against --tls-client-ca. From anyone else
// the call is refused; the HTTP side never reads it, and the REST gateway
// drops it from incoming requests, so no client can set it.
const ForwardedCallerHeader = "parley-caller"

// ReasonForwardUntrusted is the refusal of a forwarded caller from a peer
// that did not authenticate as a service.
const ReasonForwardUntrusted = "FORWARDED_CALLER_UNTRUSTED"

// maxForwardedCaller bounds the header's value.
const maxForwardedCaller = 512

// ForwardedCaller encodes p for ForwardedCallerHeader: "agent <agent name>"
// or "client <client name>". Only agents and clients are forwarded: the
// operator is never borrowed through a peer, and an anonymous caller is
// forwarded by sending nothing.
func ForwardedCaller(p Principal) string {
	switch p.Kind {
	case Agent:
		return "agent " + p.Agent
	case Client:
		return "client " + p.Client
	}
	return ""
}

// ForwardCaller returns ctx whose outgoing gRPC calls name p as the caller
// the receiving service must check, for a service acting on behalf of its
// caller. The connection must authenticate as a service (the operator token,
// or a client certificate under mTLS), or the callee refuses the call.
func ForwardCaller(ctx context.Context, p Principal) context.Context {
	v := ForwardedCaller(p)
	if v == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, ForwardedCallerHeader, v)
}

// parseForwardedCaller decodes ForwardedCaller's form; false for anything
// else, including names that are not clients/{c} or
// clients/{c}/agents/{a}.
func parseForwardedCaller(v string) (Principal, bool) {
	if len(v) > maxForwardedCaller {
		return Principal{}, false
	}
	kind, name, ok := strings.Cut(v, " ")
	if !ok {
		return Principal{}, false
	}
	parts := strings.Split(name, "/")
	for _, s := range parts {
		if s == "" || strings.ContainsAny(s, " \t\r\n") {
			return Principal{}, false
		}
	}
	switch {
	case kind == "agent" && len(parts) == 4 && parts[0] == "clients" && parts[2] == "agents":
		return Principal{Kind: Agent, Client: "clients/" + parts[1], Agent: name}, true
	case kind == "client" && len(parts) == 2 && parts[0] == "clients":
		return Principal{Kind: Client, Client: name}, true
	}
	return Principal{}, false
}

// verifiedPeer reports whether the gRPC peer of ctx presented a client
// certificate that the server verified (mTLS with --tls-client-ca).
func verifiedPeer(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	return ok && len(info.State.VerifiedChains) > 0
}

// forwarded turns a call naming a forwarded caller into that caller: the
// call's own credential must be the operator token, or its connection
// must carry a verified client certificate.
func (a *Authenticator) forwarded(ctx context.Context, c call) (Principal, error) {
	if c.header != "" {
		self, err := a.authenticate(ctx, call{method: c.method, header: c.header, remote: c.remote})
		if err != nil {
			return Principal{}, err
		}
		if self.Kind != Operator {
			return Principal{}, a.refuse(ctx, c, self, codes.Unauthenticated, ReasonForwardUntrusted,
				"only a service may name a forwarded caller: send the operator token or connect with a client certificate, not a key")
		}
	} else if !c.verifiedPeer {
		return Principal{}, a.fail(ctx, c, ReasonForwardUntrusted,
			"a forwarded caller is believed only from a service: send the operator token or connect with a client certificate")
	}
	p, ok := parseForwardedCaller(c.forwarded)
	if !ok {
		return Principal{}, a.fail(ctx, c, ReasonMalformed, "the forwarded caller must be 'agent clients/{client}/agents/{agent}' or 'client clients/{client}'")
	}
	return p, nil
}
