package rest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/resource"
)

var (
	idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
)

// agent returns the agent a request addresses, or "" after writing 404.
func (h *Handlers) agent(w http.ResponseWriter, r *http.Request) string {
	name := h.agentName(r)
	if name == "" {
		writeError(w, http.StatusNotFound, "Unable to find an agent with the provided client and agent ids")
	}
	return name
}

// agentName is the agent a request addresses, "" when malformed.
func (h *Handlers) agentName(r *http.Request) string {
	client, agent := r.PathValue("client"), r.PathValue("agent")
	if client == "" && agent == "" {
		return h.opts.DefaultAgent
	}
	if !resource.ValidID(client) || !resource.ValidID(agent) {
		return ""
	}
	return "clients/" + client + "/agents/" + agent
}

// task returns the task a request addresses, or nil after writing the
// error. A task of another agent is not found.
func (h *Handlers) task(w http.ResponseWriter, r *http.Request) *tasksv1.Task {
	agent := h.agent(w, r)
	if agent == "" {
		return nil
	}
	id := r.PathValue("task_id")
	if !idPattern.MatchString(id) {
		writeError(w, http.StatusNotFound, "Unable to find a task with the provided task_id")
		return nil
	}
	t, err := h.b.GetTask(r.Context(), &tasksv1.GetTaskRequest{Name: "tasks/" + id})
	if err != nil {
		writeStatus(w, err)
		return nil
	}
	if t.GetAgent() != agent {
		writeError(w, http.StatusNotFound, fmt.Sprintf("task %q: not found", id))
		return nil
	}
	return t
}

// taskArtifacts returns every artifact of t, for the task's artifacts field.
func (h *Handlers) taskArtifacts(ctx context.Context, t *tasksv1.Task) ([]*tasksv1.Artifact, error) {
	if t.GetArtifactCount() == 0 {
		return nil, nil
	}
	var out []*tasksv1.Artifact
	token := ""
	for {
		resp, err := h.b.ListArtifacts(ctx, &tasksv1.ListArtifactsRequest{Parent: t.GetName(), PageSize: int32(h.opts.MaxPageSize), PageToken: token})
		if err != nil {
			return nil, err
		}
		out = append(out, resp.GetArtifacts()...)
		token = resp.GetNextPageToken()
		if token == "" {
			return out, nil
		}
	}
}

func (h *Handlers) writeTask(w http.ResponseWriter, r *http.Request, t *tasksv1.Task) {
	arts, err := h.taskArtifacts(r.Context(), t)
	if err != nil {
		writeStatus(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toTaskJSON(t, arts))
}

func (h *Handlers) createTask(w http.ResponseWriter, r *http.Request) {
	agent := h.agent(w, r)
	if agent == "" {
		return
	}
	body, err := decodeBody(w, r)
	if err != nil {
		writeBodyError(w, err)
		return
	}
	t, err := h.b.CreateTask(r.Context(), &tasksv1.CreateTaskRequest{Task: &tasksv1.Task{
		Agent:               agent,
		Input:               deref(body.input),
		HasInput:            body.input != nil,
		AdditionalInputJson: body.additionalInput,
	}})
	if err != nil {
		writeStatus(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toTaskJSON(t, nil))
}

func (h *Handlers) getTask(w http.ResponseWriter, r *http.Request) {
	if t := h.task(w, r); t != nil {
		h.writeTask(w, r, t)
	}
}

// taskAction serves POST .../tasks/{task_id}:cancel, the AIP-136 custom
// method form; ServeMux wildcards are whole segments, so the verb is split
// off here.
func (h *Handlers) taskAction(w http.ResponseWriter, r *http.Request) {
	id, verb, ok := strings.Cut(r.PathValue("task_id"), ":")
	if !ok || verb != "cancel" {
		writeError(w, http.StatusNotFound, "no such route; did you mean POST .../tasks/{task_id}:cancel?")
		return
	}
	r.SetPathValue("task_id", id)
	t := h.task(w, r)
	if t == nil {
		return
	}
	t, err := h.b.CancelTask(r.Context(), &tasksv1.CancelTaskRequest{Name: t.GetName()})
	if err != nil {
		writeStatus(w, err)
		return
	}
	h.writeTask(w, r, t)
}

// paging reads current_page and page_size. It writes 400 and returns false
// for non-integers, values below 1, a page_size above the maximum, or a page
// so far out that its offset overflows int32.
func (h *Handlers) paging(w http.ResponseWriter, r *http.Request) (page, size int32, ok bool) {
	q := r.URL.Query()
	num := func(name string, def int64) (int64, bool) {
		v := q.Get(name)
		if v == "" {
			return def, true
		}
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("%s must be an integer from 1 to 2147483647, got %q", name, v))
			return 0, false
		}
		return n, true
	}
	p, ok := num("current_page", 1)
	if !ok {
		return 0, 0, false
	}
	s, ok := num("page_size", 10)
	if !ok {
		return 0, 0, false
	}
	if s > int64(h.opts.MaxPageSize) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("page_size must be at most %d, got %d", h.opts.MaxPageSize, s))
		return 0, 0, false
	}
	if (p-1)*s > 1<<31-1 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("current_page must be at most %d for page_size %d", (1<<31-1)/s+1, s))
		return 0, 0, false
	}
	return int32(p), int32(s), true
}

func pagination(total, page, size int32) paginationJSON {
	return paginationJSON{TotalItems: total, TotalPages: int32((int64(total) + int64(size) - 1) / int64(size)), CurrentPage: page, PageSize: size}
}

type taskListJSON struct {
	Tasks      []taskJSON     `json:"tasks"`
	Pagination paginationJSON `json:"pagination"`
}

func (h *Handlers) listTasks(w http.ResponseWriter, r *http.Request) {
	agent := h.agent(w, r)
	if agent == "" {
		return
	}
	page, size, ok := h.paging(w, r)
	if !ok {
		return
	}
	resp, err := h.b.ListTasks(r.Context(), &tasksv1.ListTasksRequest{Agent: agent, PageSize: size, Skip: (page - 1) * size})
	if err != nil {
		writeStatus(w, err)
		return
	}
	out := taskListJSON{Tasks: make([]taskJSON, 0, len(resp.GetTasks())), Pagination: pagination(resp.GetTotalSize(), page, size)}
	for _, t := range resp.GetTasks() {
		arts, err := h.taskArtifacts(r.Context(), t)
		if err != nil {
			writeStatus(w, err)
			return
		}
		out.Tasks = append(out.Tasks, toTaskJSON(t, arts))
	}
	writeJSON(w, http.StatusOK, out)
}

// stepWait reads how long POST .../steps should wait: "Prefer:
// respond-async" or ?wait=0 return at once; ?wait=<duration> (Go syntax,
// such as 500ms) waits at most that long, capped by the server. nil means the
// server's default (--ap-step-wait).
func stepWait(r *http.Request) (*durationpb.Duration, error) {
	for _, p := range r.Header.Values("Prefer") {
		for _, pref := range strings.Split(p, ",") {
			if strings.EqualFold(strings.TrimSpace(pref), "respond-async") {
				return durationpb.New(0), nil
			}
		}
	}
	v := r.URL.Query().Get("wait")
	if v == "" {
		return nil, nil
	}
	if v == "0" {
		return durationpb.New(0), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return nil, fmt.Errorf("wait must be a duration such as 0, 500ms or 10s, got %q", v)
	}
	return durationpb.New(d), nil
}

func (h *Handlers) createStep(w http.ResponseWriter, r *http.Request) {
	wait, err := stepWait(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	t := h.task(w, r)
	if t == nil {
		return
	}
	body, err := decodeBody(w, r)
	if err != nil {
		writeBodyError(w, err)
		return
	}
	st, err := h.b.CreateStep(r.Context(), &tasksv1.CreateStepRequest{
		Parent: t.GetName(),
		Step:   &tasksv1.Step{Input: body.input, AdditionalInputJson: body.additionalInput},
		Wait:   wait,
	})
	if err != nil {
		writeStatus(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toStepJSON(st))
}

type stepListJSON struct {
	Steps      []stepJSON     `json:"steps"`
	Pagination paginationJSON `json:"pagination"`
}

func (h *Handlers) listSteps(w http.ResponseWriter, r *http.Request) {
	page, size, ok := h.paging(w, r)
	if !ok {
		return
	}
	t := h.task(w, r)
	if t == nil {
		return
	}
	resp, err := h.b.ListSteps(r.Context(), &tasksv1.ListStepsRequest{Parent: t.GetName(), PageSize: size, Skip: (page - 1) * size})
	if err != nil {
		writeStatus(w, err)
		return
	}
	out := stepListJSON{Steps: make([]stepJSON, 0, len(resp.GetSteps())), Pagination: pagination(resp.GetTotalSize(), page, size)}
	for _, st := range resp.GetSteps() {
		out.Steps = append(out.Steps, toStepJSON(st))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handlers) getStep(w http.ResponseWriter, r *http.Request) {
	t := h.task(w, r)
	if t == nil {
		return
	}
	id := r.PathValue("step_id")
	if !idPattern.MatchString(id) {
		writeError(w, http.StatusNotFound, "Unable to find a step with the provided step_id")
		return
	}
	st, err := h.b.GetStep(r.Context(), &tasksv1.GetStepRequest{Name: t.GetName() + "/steps/" + id})
	if err != nil {
		writeStatus(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toStepJSON(st))
}

type artifactListJSON struct {
	Artifacts  []artifactJSON `json:"artifacts"`
	Pagination paginationJSON `json:"pagination"`
}

func (h *Handlers) listArtifacts(w http.ResponseWriter, r *http.Request) {
	page, size, ok := h.paging(w, r)
	if !ok {
		return
	}
	t := h.task(w, r)
	if t == nil {
		return
	}
	resp, err := h.b.ListArtifacts(r.Context(), &tasksv1.ListArtifactsRequest{Parent: t.GetName(), PageSize: size, Skip: (page - 1) * size})
	if err != nil {
		writeStatus(w, err)
		return
	}
	writeJSON(w, http.StatusOK, artifactListJSON{Artifacts: toArtifactsJSON(resp.GetArtifacts()), Pagination: pagination(resp.GetTotalSize(), page, size)})
}

// multipartOverhead is what a multipart body may add around the file.
const multipartOverhead = 64 << 10

// uploadArtifact reads a multipart/form-data body with a file part named
// "file" and an optional "relative_path" field, in either order. The file is
// spooled to a temporary file first (so relative_path may follow it), then
// handed to the backend, which stores it durably.
func (h *Handlers) uploadArtifact(w http.ResponseWriter, r *http.Request) {
	t := h.task(w, r)
	if t == nil {
		return
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" {
		writeError(w, http.StatusBadRequest, "the upload must be multipart/form-data with a part named file")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, h.opts.MaxUploadBytes+multipartOverhead)
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, http.StatusBadRequest, "the upload must be multipart/form-data with a part named file")
		return
	}
	var (
		relPath    string
		hasRelPath bool
		fileName   string
		spool      *os.File
	)
	defer func() {
		if spool != nil {
			spool.Close()
			os.Remove(spool.Name())
		}
	}()
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			writeUploadError(w, err, h.opts.MaxUploadBytes)
			return
		}
		switch part.FormName() {
		case "relative_path":
			v, err := io.ReadAll(io.LimitReader(part, 4096))
			if err != nil {
				writeUploadError(w, err, h.opts.MaxUploadBytes)
				return
			}
			relPath, hasRelPath = string(v), true
		case "file":
			if spool != nil {
				writeError(w, http.StatusBadRequest, "the upload has more than one part named file")
				return
			}
			fileName = rawFileName(part)
			if fileName == "" {
				writeError(w, http.StatusBadRequest, "the file part has no filename")
				return
			}
			if spool, err = os.CreateTemp("", "parley-upload-*"); err != nil {
				writeError(w, http.StatusInternalServerError, "internal error")
				return
			}
			n, err := io.Copy(spool, io.LimitReader(part, h.opts.MaxUploadBytes+1))
			if err != nil {
				writeUploadError(w, err, h.opts.MaxUploadBytes)
				return
			}
			if n > h.opts.MaxUploadBytes {
				writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the upload is larger than %d bytes", h.opts.MaxUploadBytes))
				return
			}
		}
	}
	if spool == nil {
		writeError(w, http.StatusBadRequest, "the upload has no part named file")
		return
	}
	if hasRelPath && relPath == "" {
		writeError(w, http.StatusBadRequest, "relative_path must not be empty; omit it to store the file at the task's root")
		return
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		writeError(w, http.StatusInternalServerError, "internal error")
		return
	}
	a, err := h.b.UploadArtifact(r.Context(), t.GetName(), &tasksv1.Artifact{FileName: fileName, RelativePath: relPath}, spool)
	if err != nil {
		writeStatus(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toArtifactJSON(a))
}

func writeUploadError(w http.ResponseWriter, err error, limit int64) {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the upload is larger than %d bytes", limit))
		return
	}
	writeError(w, http.StatusBadRequest, "the multipart body is malformed")
}

func (h *Handlers) downloadArtifact(w http.ResponseWriter, r *http.Request) {
	t := h.task(w, r)
	if t == nil {
		return
	}
	id := r.PathValue("artifact_id")
	if !idPattern.MatchString(id) {
		writeError(w, http.StatusNotFound, "Unable to find an artifact with the provided artifact_id")
		return
	}
	a, f, err := h.b.OpenArtifact(r.Context(), t.GetName()+"/artifacts/"+id)
	if err != nil {
		writeStatus(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": a.GetFileName()}))
	http.ServeContent(w, r, "", a.GetCreateTime().AsTime(), f)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// rawFileName returns the file part's filename as the client sent it.
// multipart.Part.FileName strips directories, which would quietly accept
// "../../etc/passwd" as "passwd"; a traversal attempt must be refused
// instead, so the name is checked as sent.
func rawFileName(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}
