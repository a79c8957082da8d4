package server

import (
	"strings"

	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
)

// validID reports whether s is a DNS-safe resource id: lowercase letters,
// digits and hyphens, 1 to 63 characters, starting with a letter.
func validID(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] < 'a' || s[0] > 'z' {
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

func validAgentName(name string) bool {
	p := strings.Split(name, "/")
	return len(p) == 4 && p[0] == "clients" && validID(p[1]) && p[2] == "agents" && validID(p[3])
}

// AgentName returns clients/{client}/agents/{agent}.
func AgentName(client, agent string) string { return "clients/" + client + "/agents/" + agent }

func isHex40(s string) bool {
	if len(s) != 40 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validRoutineName reports whether name is
// clients/{c}/agents/{a}/routines/{id}, id a lowercase SHA-1 hex or "steps".
func validRoutineName(name string) bool {
	i := strings.LastIndex(name, "/routines/")
	if i < 0 {
		return false
	}
	agent, id := name[:i], name[i+len("/routines/"):]
	return validAgentName(agent) && (isHex40(id) || id == hosted.StepsID)
}

func parseToolName(name string) (agent string, ok bool) {
	i := strings.LastIndex(name, "/tools/")
	if i < 0 {
		return "", false
	}
	agent, id := name[:i], name[i+len("/tools/"):]
	return agent, validAgentName(agent) && isIdent(id)
}

func isIdent(s string) bool {
	if s == "" || len(s) > 63 || s == "json" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
