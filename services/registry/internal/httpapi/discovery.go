package httpapi

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// Discovery serves an agent's /.wellknown and /wellknown.
//
// Standard shape (Working Standard and the 2024 spec page): a JSON object
// mapping each fully supported protocol's lowercase SHA-1 hex to its
// non-empty list of sources. Unsupported or sourceless protocols never
// appear.
//
// With ?detail=full, the extended shape of the beginner spec, plus each
// stored document's name and description so a sender can rule it out
// without fetching it:
//
//	{"supported":   {"<hash>": {"sources": [...], "name": "...", "description": "...", "multiround": false}},
//	 "unsupported": {"<hash>": {"comment": "...", "name": "...", "description": "..."}}}
//
// Sources stored as a path (the registry's own /protocols/{hash} when no
// public URL is configured) are made absolute against publicURL when set.
// Without it, the request's Host header is trusted only when it names a
// loopback host (local demos); any other Host could be forged to make the
// registry advertise someone else's server, so the address the request
// actually reached (the listener's) is used instead, with a warning once.
func Discovery(b Backend, publicURL string, logger *slog.Logger) http.Handler {
	publicURL = strings.TrimRight(publicURL, "/")
	var warnOnce sync.Once
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		detail := r.URL.Query().Get("detail")
		if detail != "" && detail != "full" {
			writeError(w, r, status.Error(codes.InvalidArgument, `detail: must be "full" or absent`))
			return
		}
		name := "clients/" + r.PathValue("client") + "/agents/" + r.PathValue("agent")
		a, err := b.GetAgent(r.Context(), &registryv1.GetAgentRequest{Name: name})
		if err != nil {
			writeError(w, r, err)
			return
		}
		base := publicURL
		if base == "" {
			var trusted bool
			base, trusted = requestBase(r)
			if !trusted {
				warnOnce.Do(func() {
					logger.WarnContext(r.Context(), "discovery without --public-url: ignoring the request's Host header and advertising the listener address; set --public-url", slog.String("host", r.Host), slog.String("base", base))
				})
			}
		}
		if detail == "" {
			writeJSON(w, http.StatusOK, standard(a, base), "no-cache")
			return
		}
		writeJSON(w, http.StatusOK, extended(r.Context(), b, a, base), "no-cache")
	})
}

// requestBase is the scheme and host to make the registry's own paths
// absolute against when no public URL is set: the request's Host if it is a
// loopback host, else the local address the connection arrived on. trusted
// says whether the Host header was used.
func requestBase(r *http.Request) (base string, trusted bool) {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if isLoopbackHost(r.Host) {
		return scheme + "://" + r.Host, true
	}
	if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		return scheme + "://" + local.String(), false
	}
	return scheme + "://localhost", false
}

func isLoopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

func hashOf(ref string) string { return strings.TrimPrefix(ref, "protocols/") }

func sourcesOf(p *registryv1.SupportedProtocol, base string) []string {
	var out []string
	for _, s := range p.GetSources() {
		switch {
		case s == "":
			continue
		case strings.HasPrefix(s, "/"):
			out = append(out, base+s)
		default:
			out = append(out, s)
		}
	}
	return out
}

func standard(a *registryv1.Agent, base string) map[string][]string {
	out := map[string][]string{}
	for _, p := range a.GetSupportedProtocols() {
		if srcs := sourcesOf(p, base); len(srcs) > 0 {
			out[hashOf(p.GetProtocol())] = srcs
		}
	}
	return out
}

type supportedEntry struct {
	Sources     []string `json:"sources"`
	Name        string   `json:"name,omitempty"`
	Description string   `json:"description,omitempty"`
	Multiround  *bool    `json:"multiround,omitempty"`
}

type unsupportedEntry struct {
	Comment     string `json:"comment,omitempty"`
	Name        string `json:"name,omitempty"`
	Description string `json:"description,omitempty"`
}

type extendedShape struct {
	Supported   map[string]supportedEntry   `json:"supported"`
	Unsupported map[string]unsupportedEntry `json:"unsupported"`
}

func extended(ctx context.Context, b Backend, a *registryv1.Agent, base string) extendedShape {
	out := extendedShape{Supported: map[string]supportedEntry{}, Unsupported: map[string]unsupportedEntry{}}
	describe := func(ref string) *registryv1.Protocol {
		p, err := b.GetProtocol(ctx, &registryv1.GetProtocolRequest{Name: ref})
		if err != nil {
			return nil // not stored (or unreachable): the entry goes without a name
		}
		return p
	}
	for _, p := range a.GetSupportedProtocols() {
		srcs := sourcesOf(p, base)
		if len(srcs) == 0 {
			continue
		}
		e := supportedEntry{Sources: srcs}
		if d := describe(p.GetProtocol()); d != nil {
			m := d.GetMultiround()
			e.Name, e.Description, e.Multiround = d.GetTitle(), d.GetDescription(), &m
		}
		out.Supported[hashOf(p.GetProtocol())] = e
	}
	for _, p := range a.GetUnsupportedProtocols() {
		e := unsupportedEntry{Comment: p.GetComment()}
		if d := describe(p.GetProtocol()); d != nil {
			e.Name, e.Description = d.GetTitle(), d.GetDescription()
		}
		out.Unsupported[hashOf(p.GetProtocol())] = e
	}
	return out
}
