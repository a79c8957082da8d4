package rest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/jsondepth"
	"github.com/parleyhq/parley/platform/resource"
)

// The JSON shapes of the spec. Pointers and RawMessage render null where
// the spec allows it; additional_input and artifacts never are.

type taskJSON struct {
	TaskID          string          `json:"task_id"`
	Input           *string         `json:"input"`
	AdditionalInput json.RawMessage `json:"additional_input"`
	Artifacts       []artifactJSON  `json:"artifacts"`
	// Parley additions.
	State      string `json:"state"`
	CreatedAt  string `json:"created_at"`
	ModifiedAt string `json:"modified_at"`
}

type stepJSON struct {
	TaskID           string          `json:"task_id"`
	StepID           string          `json:"step_id"`
	Name             *string         `json:"name"`
	Status           string          `json:"status"`
	Input            *string         `json:"input"`
	AdditionalInput  json.RawMessage `json:"additional_input"`
	Output           *string         `json:"output"`
	AdditionalOutput json.RawMessage `json:"additional_output"`
	Artifacts        []artifactJSON  `json:"artifacts"`
	IsLast           bool            `json:"is_last"`
	// Parley additions.
	StatusMessage string `json:"status_message,omitempty"`
	CreatedAt     string `json:"created_at"`
	ModifiedAt    string `json:"modified_at"`
}

type artifactJSON struct {
	ArtifactID   string  `json:"artifact_id"`
	AgentCreated bool    `json:"agent_created"`
	FileName     string  `json:"file_name"`
	RelativePath *string `json:"relative_path"`
	// Parley additions.
	SizeBytes int64  `json:"size_bytes"`
	CreatedAt string `json:"created_at"`
}

// paginationJSON holds JSON numbers (int32 in the spec), never strings.
type paginationJSON struct {
	TotalItems  int32 `json:"total_items"`
	TotalPages  int32 `json:"total_pages"`
	CurrentPage int32 `json:"current_page"`
	PageSize    int32 `json:"page_size"`
}

func timeJSON(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().UTC().Format(time.RFC3339Nano)
}

func object(raw []byte) json.RawMessage {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage("{}")
	}
	return raw
}

var taskStates = map[tasksv1.Task_State]string{
	tasksv1.Task_STATE_ACTIVE:    "active",
	tasksv1.Task_STATE_FINISHED:  "finished",
	tasksv1.Task_STATE_CANCELLED: "cancelled",
}

func toTaskJSON(t *tasksv1.Task, arts []*tasksv1.Artifact) taskJSON {
	var input *string
	if t.GetHasInput() {
		input = &t.Input
	}
	return taskJSON{
		TaskID:          resource.ID(t.GetName()),
		Input:           input,
		AdditionalInput: object(t.GetAdditionalInputJson()),
		Artifacts:       toArtifactsJSON(arts),
		State:           taskStates[t.GetState()],
		CreatedAt:       timeJSON(t.GetCreateTime()),
		ModifiedAt:      timeJSON(t.GetUpdateTime()),
	}
}

var stepStatuses = map[tasksv1.Step_Status]string{
	tasksv1.Step_STATUS_CREATED:   "created",
	tasksv1.Step_STATUS_RUNNING:   "running",
	tasksv1.Step_STATUS_COMPLETED: "completed",
}

func toStepJSON(st *tasksv1.Step) stepJSON {
	out := stepJSON{
		TaskID:           strings.Split(st.GetName(), "/")[1],
		StepID:           resource.ID(st.GetName()),
		Status:           stepStatuses[st.GetStatus()],
		Input:            st.Input,
		AdditionalInput:  object(st.GetAdditionalInputJson()),
		Output:           st.Output,
		AdditionalOutput: json.RawMessage("null"),
		Artifacts:        toArtifactsJSON(st.GetArtifacts()),
		IsLast:           st.GetIsLast(),
		StatusMessage:    st.GetStatusMessage(),
		CreatedAt:        timeJSON(st.GetCreateTime()),
		ModifiedAt:       timeJSON(st.GetUpdateTime()),
	}
	if st.GetStepName() != "" {
		out.Name = &st.StepName
	}
	if st.GetStatus() == tasksv1.Step_STATUS_COMPLETED {
		out.AdditionalOutput = object(st.GetAdditionalOutputJson())
	}
	return out
}

func toArtifactsJSON(arts []*tasksv1.Artifact) []artifactJSON {
	out := make([]artifactJSON, 0, len(arts))
	for _, a := range arts {
		out = append(out, toArtifactJSON(a))
	}
	return out
}

func toArtifactJSON(a *tasksv1.Artifact) artifactJSON {
	out := artifactJSON{
		ArtifactID:   resource.ID(a.GetName()),
		AgentCreated: a.GetAgentCreated(),
		FileName:     a.GetFileName(),
		SizeBytes:    a.GetSizeBytes(),
		CreatedAt:    timeJSON(a.GetCreateTime()),
	}
	if a.GetRelativePath() != "" {
		out.RelativePath = &a.RelativePath
	}
	return out
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

type errorJSON struct {
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, errorJSON{Message: msg})
}

// writeStatus renders a backend (gRPC status) error with the HTTP status
// every Parley route uses (grpcerr.HTTPStatus). An UNAVAILABLE without a
// reason is the gRPC transport's (`parley gateway` cannot reach the tasks
// service), and its text names our addresses: callers get one sentence.
func writeStatus(w http.ResponseWriter, err error) {
	code := grpcerr.HTTPStatus(err)
	st := status.Convert(err)
	msg := st.Message()
	switch {
	case code == http.StatusInternalServerError:
		msg = "internal error"
	case st.Code() == codes.Unavailable && grpcerr.Reason(err) == "":
		msg = "the tasks service is unavailable; retry later"
	}
	writeError(w, code, msg)
}

// WriteRouteError answers an unknown path (404) or a wrong method (405)
// under the Agent Protocol routes in their {"message"} shape, for
// serve.Server.HandleErrors.
func WriteRouteError(w http.ResponseWriter, _ *http.Request, code int, msg string) {
	writeError(w, code, msg)
}

// maxJSONBody caps task and step request bodies.
const maxJSONBody = 1 << 20

// errBody reports a request body that is not acceptable (422).
type errBody struct{ msg string }

func (e errBody) Error() string { return e.msg }

// requestBody is the spec's TaskRequestBody and StepRequestBody: an
// optional string input and an optional object additional_input. Other
// fields are ignored, as the spec's schemas allow.
type requestBody struct {
	input           *string
	additionalInput []byte
}

// decodeBody reads a JSON object body. An empty body counts as {}. Wrong
// types, non-JSON and trailing data are errBody (422); an oversized body is
// *http.MaxBytesError (413).
func decodeBody(w http.ResponseWriter, r *http.Request) (requestBody, error) {
	var out requestBody
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		return out, err
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return out, nil
	}
	if raw[0] != '{' {
		return out, errBody{"the request body must be a JSON object"}
	}
	if jsondepth.Check(raw, jsondepth.Max) != nil {
		return out, errBody{fmt.Sprintf("the request body is nested more than %d levels deep", jsondepth.Max)}
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&fields); err != nil {
		return out, errBody{fmt.Sprintf("the request body is not valid JSON: %v", err)}
	}
	if _, err := dec.Token(); err != io.EOF {
		return out, errBody{"the request body has data after its JSON object"}
	}
	if v, ok := fields["input"]; ok && string(v) != "null" {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return out, errBody{"input must be a string or null"}
		}
		out.input = &s
	}
	if v, ok := fields["additional_input"]; ok && string(v) != "null" {
		if v[0] != '{' {
			return out, errBody{"additional_input must be an object or null"}
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, v); err != nil {
			return out, errBody{"additional_input must be an object or null"}
		}
		out.additionalInput = compact.Bytes()
	}
	return out, nil
}

// writeBodyError renders a decodeBody error.
func writeBodyError(w http.ResponseWriter, err error) {
	var mbe *http.MaxBytesError
	var be errBody
	switch {
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than %d bytes", mbe.Limit))
	case errors.As(err, &be):
		writeError(w, http.StatusUnprocessableEntity, be.msg)
	default:
		writeError(w, http.StatusBadRequest, "the request body could not be read")
	}
}
