package agora

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// Dialect is a peer's reply shape (specs/agora.md, section 2).
type Dialect int

// Dialects. Spec2024 is the default.
const (
	Spec2024 Dialect = iota
	Std
	Pylib
)

// ParseDialect reads "spec2024", "std" or "pylib".
func ParseDialect(s string) (Dialect, error) {
	switch s {
	case "", "spec2024":
		return Spec2024, nil
	case "std":
		return Std, nil
	case "pylib":
		return Pylib, nil
	}
	return Spec2024, fmt.Errorf("unknown Agora dialect %q (want spec2024, std or pylib)", s)
}

// String returns the dialect's flag spelling (spec2024, std, pylib).
func (d Dialect) String() string {
	switch d {
	case Std:
		return "std"
	case Pylib:
		return "pylib"
	}
	return "spec2024"
}

// Reply is an HTTP reply: status code and JSON bytes.
type Reply struct {
	Status int
	Body   []byte
}

// Conversation is what multiround replies carry.
type Conversation struct {
	ID      string
	Expires int64 // Unix seconds
}

// Success answers with body (raw JSON). conv is nil outside multiround
// conversations.
func (d Dialect) Success(body json.RawMessage, conv *Conversation) Reply {
	buf := make([]byte, 0, len(body)+96)
	buf = append(buf, `{"status":"success","body":`...)
	if len(body) == 0 {
		body = null
	}
	buf = append(buf, body...)
	buf = appendConv(buf, conv)
	buf = append(buf, '}')
	return Reply{Status: http.StatusOK, Body: buf}
}

// Failure is an Agora-level failure for an error the protocol does not
// cover.
func (d Dialect) Failure(msg string, conv *Conversation) Reply {
	m, _ := json.Marshal(msg)
	buf := make([]byte, 0, 2*len(m)+96)
	switch d {
	case Pylib:
		// pylib reads status and body always; error and message carry the text.
		buf = append(buf, `{"status":"failure","body":null,"error":`...)
		buf = append(buf, m...)
		buf = append(buf, `,"message":`...)
		buf = append(buf, m...)
	case Std:
		buf = append(buf, `{"status":"failure","error":`...)
		buf = append(buf, m...)
	default:
		buf = append(buf, `{"status":"failure","body":`...)
		buf = append(buf, m...)
		buf = append(buf, `,"error":`...)
		buf = append(buf, m...)
	}
	buf = appendConv(buf, conv)
	buf = append(buf, '}')
	return Reply{Status: http.StatusOK, Body: buf}
}

// Unsupported answers a protocol the agent does not support.
func (d Dialect) Unsupported(hash string) Reply {
	switch d {
	case Std:
		return d.Failure("Unsupported protocol", nil)
	case Pylib:
		m, _ := json.Marshal(hash + " is not suitable for execution")
		return Reply{Status: http.StatusOK, Body: []byte(`{"status":"error","body":null,"error":` + string(m) + `,"message":` + string(m) + `}`)}
	}
	return Reply{Status: http.StatusOK, Body: []byte(`{"status":"rejected"}`)}
}

// Malformed answers a request that is not a valid envelope: HTTP 400, or for
// pylib HTTP 200 with status error, since pylib treats other codes as a
// transport failure.
func (d Dialect) Malformed(msg string) Reply {
	m, _ := json.Marshal(msg)
	if d == Pylib {
		return Reply{Status: http.StatusOK, Body: []byte(`{"status":"error","body":null,"error":` + string(m) + `,"message":` + string(m) + `}`)}
	}
	return Reply{Status: http.StatusBadRequest, Body: []byte(`{"status":"failure","body":` + string(m) + `,"error":` + string(m) + `}`)}
}

// UnknownConversation answers a follow-up to a conversation that never
// existed (or is not the caller's): 404, or pylib's 200 error.
func (d Dialect) UnknownConversation() Reply {
	if d == Pylib {
		return Reply{Status: http.StatusOK, Body: []byte(`{"status":"error","body":null,"error":"Conversation not found.","message":"Conversation not found."}`)}
	}
	return Reply{Status: http.StatusNotFound, Body: []byte(`{"status":"failure","body":"Conversation not found","error":"Conversation not found"}`)}
}

// Ended answers DELETE of a conversation: always 200 success.
func (d Dialect) Ended() Reply {
	if d == Pylib {
		return Reply{Status: http.StatusOK, Body: []byte(`{"status":"success","body":null}`)}
	}
	return Reply{Status: http.StatusOK, Body: []byte(`{"status":"success"}`)}
}

func appendConv(buf []byte, conv *Conversation) []byte {
	if conv == nil {
		return buf
	}
	buf = append(buf, `,"conversationId":"`...)
	buf = append(buf, conv.ID...) // ids are URL-safe base64: no escaping needed
	buf = append(buf, `","conversationExpires":`...)
	return strconv.AppendInt(buf, conv.Expires, 10)
}

// UnknownAgent answers a request for an agent that is not hosted here: 404,
// as an unknown endpoint.
func (d Dialect) UnknownAgent() Reply {
	return Reply{Status: http.StatusNotFound, Body: []byte(`{"status":"failure","body":"Unknown agent","error":"Unknown agent"}`)}
}

// Fault answers an internal fault or an unavailable dependency
// (specs/agora.md, section 8): std 500 with its failure body; spec2024 503
// with a failure body (a transient failure the caller may retry); pylib 200
// with status error on POST / (pylib reads other codes as a transport
// failure) and 500 on follow-ups (conversation routes), as the reference
// library answers.
func (d Dialect) Fault(msg string, followUp bool) Reply {
	m, _ := json.Marshal(msg)
	switch d {
	case Pylib:
		code := http.StatusOK
		if followUp {
			code = http.StatusInternalServerError
		}
		return Reply{Status: code, Body: []byte(`{"status":"error","body":null,"error":` + string(m) + `,"message":` + string(m) + `}`)}
	case Std:
		return Reply{Status: http.StatusInternalServerError, Body: []byte(`{"status":"failure","error":` + string(m) + `}`)}
	}
	return Reply{Status: http.StatusServiceUnavailable, Body: []byte(`{"status":"failure","body":` + string(m) + `,"error":` + string(m) + `}`)}
}
