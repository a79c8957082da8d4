package rest

import (
	"net/http"

	"github.com/parleyhq/parley/platform/auth"
)

// guard checks the addressed agent's access setting before next runs. The
// policy table lets anyone reach these routes (the Agent Protocol has no
// authentication) and has already turned any credential sent into the
// principal; an agent with `token` access then admits only its own key,
// its client's key and the operator: no credential is 401, another one 403,
// before anything about the task is read. A malformed agent is left to
// next's 404. Without access control (no principal) every agent is public.
func (h *Handlers) guard(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.opts.TokenRequired == nil {
			next(w, r)
			return
		}
		agent := h.agentName(r)
		if agent == "" {
			next(w, r)
			return
		}
		p, on := auth.FromContext(r.Context())
		if !on || p.Kind == auth.Operator {
			next(w, r)
			return
		}
		token, err := h.opts.TokenRequired(r.Context(), agent)
		switch {
		case err != nil:
			writeStatus(w, err)
		case !token:
			next(w, r)
		case p.Kind == auth.Anonymous:
			w.Header().Set("WWW-Authenticate", `Bearer realm="parley"`)
			writeError(w, http.StatusUnauthorized, "this agent's Agent Protocol routes need a credential: send 'authorization: Bearer <key>' with the agent's key or its client's key")
		case (p.Kind == auth.Agent || p.Kind == auth.Client) && p.Owns(agent):
			next(w, r)
		default:
			writeError(w, http.StatusForbidden, p.String()+" may not call this agent's Agent Protocol routes: use the agent's key or its client's key")
		}
	})
}
