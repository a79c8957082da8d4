package server

import (
	"strings"

	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
)

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
	return directory.ValidAgentName(agent) && (isHex40(id) || id == hosted.StepsID)
}

func parseToolName(name string) (agent string, ok bool) {
	i := strings.LastIndex(name, "/tools/")
	if i < 0 {
		return "", false
	}
	agent, id := name[:i], name[i+len("/tools/"):]
	return agent, directory.ValidAgentName(agent) && isIdent(id)
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
