package resource

import "strings"

// IDRule says in words what ValidID accepts, for error messages.
const IDRule = "1 to 63 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen"

// ValidID reports whether s is a client or agent id: DNS-safe (RFC 1035
// labels), IDRule. Neither ':' nor '/' can appear, so `<client>:<agent>`
// and clients/{client}/agents/{agent} are unambiguous. The registry owns
// agents and refuses any other id; every service checks names with this
// one rule (issue 9).
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] < 'a' || s[0] > 'z' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ValidAgentName reports whether name is clients/{client}/agents/{agent}
// with both ids valid (ValidID).
func ValidAgentName(name string) bool {
	client, agent, ok := SplitAgentName(name)
	return ok && ValidID(client) && ValidID(agent)
}

// SplitAgentName returns the ids of clients/{client}/agents/{agent},
// unchecked; ok is false when name does not have that shape.
func SplitAgentName(name string) (client, agent string, ok bool) {
	rest, ok := strings.CutPrefix(name, "clients/")
	if !ok {
		return "", "", false
	}
	client, agent, ok = strings.Cut(rest, "/agents/")
	return client, agent, ok
}
