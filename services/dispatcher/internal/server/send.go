package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/egress"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/jsondepth"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// maxReplyBytes caps a peer's reply and /wellknown document.
const maxReplyBytes = 1 << 20

// Send implements DispatcherServiceServer. It picks a protocol in the
// reference's order (specs/agora.md, section 9): one the target lists in its
// well-known document that we hold a sender routine for; else one it lists
// whose metadata fits the task; else one we hold a sender routine for whose
// metadata fits; else one it lists that the LLM judges fit; else natural
// language.
func (s *Server) Send(ctx context.Context, req *dispatcherv1.SendRequest) (*dispatcherv1.SendResponse, error) {
	var v grpcerr.Violations
	if !validAgentName(req.GetAgent()) {
		v.Add("agent", "must be clients/{client}/agents/{agent}")
	}
	target, err := url.Parse(req.GetTargetUrl())
	if err != nil || (target.Scheme != "https" && target.Scheme != "http") || target.Host == "" {
		v.Add("target_url", "must be an absolute http or https URL")
	}
	if (req.GetTask() == "") == (req.GetText() == "") {
		v.Add("task", "exactly one of task and text must be set")
	}
	if req.GetTaskDataJson() != "" && !json.Valid([]byte(req.GetTaskDataJson())) {
		v.Add("task_data_json", "must be JSON")
	}
	for field, raw := range map[string]string{"input_schema_json": req.GetInputSchemaJson(), "output_schema_json": req.GetOutputSchemaJson()} {
		if raw != "" && !json.Valid([]byte(raw)) {
			v.Add(field, "must be JSON")
		}
	}
	if h := req.GetProtocolHash(); h != "" && !isHex40(strings.ToLower(h)) {
		v.Add("protocol_hash", "must be 40 hex characters")
	}
	dialect, derr := agora.ParseDialect(req.GetDialect())
	if derr != nil {
		v.Add("dialect", derr.Error())
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	agent := req.GetAgent()
	if _, err := s.agent(ctx, agent); err != nil {
		return nil, s.peerError(ctx, err, "agent "+agent)
	}
	base := strings.TrimSuffix(req.GetTargetUrl(), "/")

	if req.GetText() != "" {
		body, _ := json.Marshal(req.GetText())
		rep, err := s.post(ctx, base, dialect, "", nil, body)
		if err != nil {
			return nil, err
		}
		s.countSend(ctx, agent, "", base, false)
		s.metrics.sends.WithLabelValues("text").Inc()
		return &dispatcherv1.SendResponse{Status: rep.status, ResultJson: string(rep.body), Path: "text", Error: rep.err}, nil
	}

	taskData := json.RawMessage(req.GetTaskDataJson())
	if len(taskData) == 0 {
		taskData = json.RawMessage("null")
	}
	hexHash := strings.ToLower(req.GetProtocolHash())
	var negName string
	if hexHash == "" {
		hexHash = s.pickProtocol(ctx, agent, req.GetTask(), base)
		if hexHash == "" || !s.hasSender(ctx, agent, hexHash) {
			var agreed string
			if agreed, negName = s.maybeNegotiate(ctx, agent, base, dialect, req, hexHash); agreed != "" {
				hexHash = agreed
			}
		}
	}
	if hexHash == "" {
		// No protocol fits: natural language, written by the LLM when there
		// is one, else the task data itself.
		body, err := s.complete(ctx, s.taskLLM(LLMRequest{Agent: agent, Peer: base, Purpose: PurposeSend, Input: taskData}, req))
		path := pathLLM
		if errors.Is(err, ErrNoLLM) {
			body, path = taskData, "text"
		} else if err != nil {
			return nil, sendLLMError(err)
		}
		rep, err := s.post(ctx, base, dialect, "", nil, body)
		if err != nil {
			return nil, err
		}
		s.countSend(ctx, agent, req.GetTask(), base, false)
		s.metrics.sends.WithLabelValues(path).Inc()
		return &dispatcherv1.SendResponse{Status: rep.status, ResultJson: string(rep.body), Path: path, Error: rep.err, Negotiation: negName}, nil
	}

	pe, err := s.protocol(ctx, hexHash, nil)
	if err != nil {
		return nil, s.peerError(ctx, err, "protocol "+hexHash)
	}
	r, rerr := s.routines.get(ctx, agent, hexHash)
	hasRoutine := rerr == nil && r.usable() && r.prog != nil
	path := pathRoutine
	var body json.RawMessage
	if hasRoutine && r.prog.Has("send") {
		// A failed routine leaves body nil and the LLM writes it instead;
		// runRoutine has already recorded the failure.
		body, _, _ = s.runRoutine(ctx, r, "send", []json.RawMessage{taskData}, nil, nil)
	}
	if body == nil {
		path = pathLLM
		body, err = s.complete(ctx, s.taskLLM(LLMRequest{Agent: agent, Peer: base, Purpose: PurposeSend, Protocol: pe.pd.GetContent(), Input: taskData}, req))
		if errors.Is(err, ErrNoLLM) {
			return nil, grpcerr.New(codes.FailedPrecondition, fmt.Sprintf("agent %s has no sender routine for protocol %s and no LLM is configured", agent, hexHash), "NO_SENDER", Domain, map[string]string{"protocol": hexHash})
		}
		if err != nil {
			return nil, sendLLMError(err)
		}
		s.shadow(ctx, agent, hexHash, negotiatorv1.RoutineSide_ROUTINE_SIDE_SENDER, "send", []json.RawMessage{taskData}, nil, body)
	}
	rep, err := s.post(ctx, base, dialect, hexHash, pe.pd.GetContent(), body)
	if err != nil {
		return nil, err
	}
	s.countSend(ctx, agent, req.GetTask(), base, true)
	result := rep.body
	if rep.status == "success" {
		result, path = s.parseReply(ctx, agent, r, hasRoutine, pe, req, base, rep.body, path)
	}
	s.metrics.sends.WithLabelValues(path).Inc()
	return &dispatcherv1.SendResponse{Status: rep.status, ResultJson: string(result), ProtocolHash: hexHash, Path: path, Error: rep.err, Negotiation: negName}, nil
}

// taskLLM adds the Send's task description and schemas to an LLM request.
func (s *Server) taskLLM(l LLMRequest, req *dispatcherv1.SendRequest) LLMRequest {
	l.Task, l.TaskDescription = req.GetTask(), req.GetTaskDescription()
	if v := req.GetInputSchemaJson(); v != "" {
		l.InputSchema = json.RawMessage(v)
	}
	if v := req.GetOutputSchemaJson(); v != "" {
		l.OutputSchema = json.RawMessage(v)
	}
	return l
}

// sendLLMError is Send's error when the LLM could not write a message.
func sendLLMError(err error) error {
	if errors.Is(err, ErrLLMBudget) {
		return grpcerr.New(codes.ResourceExhausted, err.Error(), "LLM_BUDGET_EXHAUSTED", Domain, nil)
	}
	return grpcerr.New(codes.Unavailable, "the language model could not write the message: "+err.Error(), "LLM_FAILED", Domain, nil)
}

// parseReply reads a successful reply with the routine's parse, else the
// LLM when parse fails, else returns the body as is.
func (s *Server) parseReply(ctx context.Context, agent string, r *compiledRoutine, hasRoutine bool, pe *protocolEntry, req *dispatcherv1.SendRequest, base string, body json.RawMessage, path string) (json.RawMessage, string) {
	query, _ := agora.Query(body)
	if !hasRoutine || !r.prog.Has("parse") {
		return query, path
	}
	out, _, err := s.runRoutine(ctx, r, "parse", []json.RawMessage{query}, nil, nil)
	if err == nil {
		return out, path
	}
	out, lerr := s.complete(ctx, s.taskLLM(LLMRequest{Agent: agent, Peer: base, Purpose: PurposeParse, Protocol: pe.pd.GetContent(), Input: query}, req))
	if lerr != nil {
		return query, path
	}
	if path != pathLLM { // at most one shadow run per Send: none ran for send
		s.shadow(ctx, agent, pe.pd.GetSha1Hex(), negotiatorv1.RoutineSide_ROUTINE_SIDE_SENDER, "parse", []json.RawMessage{query}, nil, out)
	}
	return out, pathLLM
}

func (s *Server) countSend(ctx context.Context, agent, task, target string, withProtocol bool) {
	if err := s.store.CountSend(context.WithoutCancel(ctx), agent, task, target, withProtocol); err != nil {
		s.logger.WarnContext(ctx, "send not counted", slog.Any("err", err))
	}
}

// pickProtocol returns the hash to use for task at target, or "".
//
// A target chooses what its well-known document lists, so what one Send
// spends on it is bounded: a listed hash we hold a sender routine for costs
// nothing, and so does one whose PD is already in our cache; of the others
// only the first --send-max-listed-protocols (in hash order) are resolved
// through the registry, and those that do not resolve are not tried again
// for that target for 10 minutes; the LLM judges only
// resolved PDs whose metadata shares a word with the task, at most
// --send-max-judge-calls per Send, and a "no" is kept for 10 minutes per
// (target, hash, task).
func (s *Server) pickProtocol(ctx context.Context, agent, task, base string) string {
	listed := s.targetProtocols(ctx, base)
	hashes := make([]string, 0, len(listed))
	for h := range listed {
		hashes = append(hashes, h)
	}
	sort.Strings(hashes)
	hasSender := func(h string) bool {
		r, err := s.routines.get(ctx, agent, h)
		return err == nil && r.usable() && r.prog != nil && r.prog.Has("send")
	}
	var own []string // hashes we hold a routine for
	ownSet := map[string]bool{}
	if list, err := s.store.ListRoutines(ctx, agent, "", 1000); err == nil {
		for _, r := range list {
			if h := lastSegment(r.GetName()); isHex40(h) {
				own = append(own, h)
				ownSet[h] = true
			}
		}
	}
	for _, h := range hashes {
		if ownSet[h] && hasSender(h) {
			return h
		}
	}
	// PDs we already hold cost nothing to read; of the others, only those
	// among the first SendMaxListed listed are resolved.
	var resolved []*protocolEntry
	for i, h := range hashes {
		pe, ok := s.protocols.peek(h)
		if ok {
			if fits(pe, task) {
				return h
			}
			resolved = append(resolved, pe)
			continue
		}
		if i >= s.opts.SendMaxListed {
			continue
		}
		missKey := base + "\x00" + h
		if s.pickMisses.has(missKey) {
			continue
		}
		pe, err := s.protocol(ctx, h, listed[h])
		if err != nil {
			if ctx.Err() == nil && status.Code(err) != codes.Unavailable {
				s.pickMisses.add(missKey)
			}
			continue
		}
		if fits(pe, task) {
			return h
		}
		resolved = append(resolved, pe)
	}
	for _, h := range own {
		if hasSender(h) {
			if pe, err := s.protocol(ctx, h, nil); err == nil && fits(pe, task) {
				return h
			}
		}
	}
	judged := 0
	for _, pe := range resolved {
		if judged >= s.opts.SendMaxJudge {
			break
		}
		h := pe.pd.GetSha1Hex()
		missKey := base + "\x00" + h + "\x00" + task
		if !related(pe, task) || s.pickMisses.has(missKey) {
			continue
		}
		judged++
		out, err := s.complete(ctx, LLMRequest{Agent: agent, Peer: base, Purpose: PurposeJudge, Protocol: pe.pd.GetContent(), Task: task})
		if errors.Is(err, ErrNoLLM) || errors.Is(err, ErrLLMBudget) {
			break
		}
		if err == nil && string(bytes.TrimSpace(out)) == "true" {
			return h
		}
		if err == nil {
			s.pickMisses.add(missKey)
		}
	}
	return ""
}

// related is the cheap check before asking the LLM whether a PD fits: some
// word of the task (four letters or more) occurs in the PD's title,
// description or tags, ignoring case.
func related(pe *protocolEntry, task string) bool {
	meta := strings.ToLower(pe.pd.GetTitle() + " " + pe.pd.GetDescription() + " " + strings.Join(pe.pd.GetTags(), " "))
	for _, w := range strings.FieldsFunc(strings.ToLower(task), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if len(w) >= 4 && strings.Contains(meta, w) {
			return true
		}
	}
	return false
}

// fits reports whether a PD's metadata names the task: its title, a tag or
// its description contains the task name, ignoring case, - and _.
func fits(pe *protocolEntry, task string) bool {
	norm := func(s string) string {
		return strings.NewReplacer("-", " ", "_", " ").Replace(strings.ToLower(s))
	}
	t := norm(task)
	if t == "" {
		return false
	}
	if strings.Contains(norm(pe.pd.GetTitle()), t) || strings.Contains(norm(pe.pd.GetDescription()), t) {
		return true
	}
	for _, tag := range pe.pd.GetTags() {
		if norm(tag) == t {
			return true
		}
	}
	return false
}

// targetProtocols fetches the target's discovery document: {base}/.wellknown,
// else {base}/wellknown, in the std, extended or paper shape. Failures give
// an empty map.
func (s *Server) targetProtocols(ctx context.Context, base string) map[string][]string {
	m, err := s.wellknown.get(ctx, base, func(ctx context.Context) (map[string][]string, error) {
		for _, suffix := range []string{"/.wellknown", "/wellknown"} {
			if m, ok := s.fetchWellknown(ctx, base+suffix); ok {
				return m, nil
			}
		}
		return map[string][]string{}, nil
	})
	if err != nil {
		return nil
	}
	return m
}

func (s *Server) fetchWellknown(ctx context.Context, u string) (map[string][]string, bool) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.SendTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, false
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, false
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if err != nil {
		return nil, false
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(data, &raw) != nil {
		return nil, false
	}
	if p, ok := raw["protocols"]; ok { // paper shape
		_ = json.Unmarshal(p, &raw)
	} else if p, ok := raw["supported"]; ok { // extended shape
		var sup map[string]struct {
			Sources []string `json:"sources"`
		}
		if json.Unmarshal(p, &sup) != nil {
			return nil, false
		}
		raw = map[string]json.RawMessage{}
		for h, e := range sup {
			b, _ := json.Marshal(e.Sources)
			raw[h] = b
		}
	}
	out := map[string][]string{}
	for k, v := range raw {
		h, form, err := agora.ParseHash(k)
		if err != nil || form != agora.HashHex && form != agora.HashBase64 {
			continue
		}
		var sources []string
		_ = json.Unmarshal(v, &sources)
		out[(&agora.Envelope{Hash: h}).HexHash()] = sources
	}
	return out, true
}

type peerReply struct {
	status string
	body   json.RawMessage
	err    string
	conv   string // conversationId of a multiround reply
}

// post sends one envelope in the peer's dialect and reads its reply. It
// retries only when the request cannot have reached the peer (dial errors).
func (s *Server) post(ctx context.Context, base string, d agora.Dialect, hexHash string, pd []byte, body json.RawMessage) (peerReply, error) {
	return s.postTo(ctx, base, d, hexHash, pd, body, false)
}

// postTo is post to any URL (a base or a conversation), multiround or not.
func (s *Server) postTo(ctx context.Context, base string, d agora.Dialect, hexHash string, pd []byte, body json.RawMessage, multiround bool) (peerReply, error) {
	env := map[string]any{}
	var sources []string
	if hexHash != "" {
		if s.opts.PublicURL != "" {
			sources = append(sources, strings.TrimSuffix(s.opts.PublicURL, "/")+"/protocols/"+hexHash)
		} else {
			sources = append(sources, "data:text/plain;charset=utf-8;base64,"+base64.StdEncoding.EncodeToString(pd))
		}
	}
	switch d {
	case agora.Std:
		if hexHash != "" {
			env["protocolHash"] = hexHash
			env["protocolSources"] = sources
		}
		env["body"] = body
		if multiround {
			env["multiround"] = true
		}
	case agora.Pylib:
		env["protocolHash"], env["protocolSources"] = nil, nil
		if hexHash != "" {
			raw, _, _ := agora.ParseHash(hexHash)
			env["protocolHash"], env["protocolSources"] = base64.StdEncoding.EncodeToString(raw), sources
		}
		env["body"] = agora.BodyAs(body, true)
		env["multiround"] = multiround
	default:
		env["protocolHash"], env["protocolSources"] = nil, nil
		if hexHash != "" {
			env["protocolHash"], env["protocolSources"] = hexHash, sources
		}
		env["body"] = agora.BodyAs(body, true)
		env["multiround"] = multiround
	}
	data, err := json.Marshal(env)
	if err != nil {
		return peerReply{}, status.Error(codes.Internal, "internal error")
	}
	var lastErr error
	for attempt := 0; attempt <= s.opts.SendRetries; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(time.Duration(100<<attempt) * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return peerReply{}, status.FromContextError(ctx.Err()).Err()
			case <-t.C:
			}
		}
		rep, err := s.postOnce(ctx, base, data)
		if err == nil {
			return rep, nil
		}
		lastErr = err
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" {
			break
		}
	}
	if ctx.Err() != nil {
		return peerReply{}, status.FromContextError(ctx.Err()).Err()
	}
	return peerReply{}, s.targetError(ctx, base, lastErr)
}

func (s *Server) postOnce(ctx context.Context, u string, data []byte) (peerReply, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.SendTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(data))
	if err != nil {
		return peerReply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return peerReply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if err != nil {
		return peerReply{}, err
	}
	// Parse JSON whatever the Content-Type (paper-demo sends text/html).
	var w struct {
		Status  string          `json:"status"`
		Body    json.RawMessage `json:"body"`
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Conv    string          `json:"conversationId"`
	}
	if err := jsondepth.Check(raw, jsondepth.Max); err != nil {
		return peerReply{}, fmt.Errorf("HTTP %d with a reply: %w", resp.StatusCode, err)
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return peerReply{}, badReplyError{status: resp.StatusCode}
	}
	rep := peerReply{status: w.Status, body: w.Body, err: w.Message, conv: w.Conv}
	if rep.status == "" {
		rep.status = "error"
	}
	if len(rep.body) == 0 {
		rep.body = json.RawMessage("null")
	}
	var es string
	var eo struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(w.Error, &es) == nil && es != "" {
		rep.err = es
	} else if json.Unmarshal(w.Error, &eo) == nil && eo.Message != "" {
		rep.err = eo.Message
	}
	return rep, nil
}

// ListSendCounts implements DispatcherServiceServer.
func (s *Server) ListSendCounts(ctx context.Context, req *dispatcherv1.ListSendCountsRequest) (*dispatcherv1.ListSendCountsResponse, error) {
	size, after, err := listParams(req.GetParent(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	list, err := s.store.ListSendCounts(ctx, req.GetParent())
	if err != nil {
		return nil, s.toStatus(ctx, err, "")
	}
	// The store lists counts in (task, target) order: the key below sorts
	// the same way, as neither part holds a NUL.
	page, next := paginate(list, func(c store.SendCount) string { return c.Task + "\x00" + c.TargetURL }, after, size)
	resp := &dispatcherv1.ListSendCountsResponse{}
	if next != "" {
		resp.NextPageToken = pagetoken.Encode(next, req.GetParent())
	}
	for _, c := range page {
		resp.Counts = append(resp.Counts, &dispatcherv1.SendCount{Task: c.Task, TargetUrl: c.TargetURL, Conversations: c.Conversations, WithProtocol: c.WithProtocol})
	}
	return resp, nil
}

// newSendClient returns the HTTP client for outbound envelopes. Unless
// allowPrivate, it refuses to dial loopback, private, link-local and other
// internal addresses (platform/egress checks the dialed IP, so DNS
// rebinding cannot evade it), and it does not follow redirects. lookup,
// when set, replaces the system resolver (a test seam).
func newSendClient(allowPrivate bool, lookup egress.Lookup) *http.Client {
	dialer := &egress.Dialer{Timeout: 2 * time.Second, Lookup: lookup}
	if allowPrivate {
		dialer.Allow = egress.AllowAll
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = dialer.DialContext
	tr.Proxy = nil
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// badReplyError is a peer's answer that is not an Agora reply.
type badReplyError struct{ status int }

func (e badReplyError) Error() string {
	return fmt.Sprintf("answered HTTP %d with a reply that is not JSON", e.status)
}

// targetError is Send's error for a target that could not be used. The
// caller named the target, so the message never carries what our resolver
// or network said (addresses, resolver, internal names); that goes to the
// log.
func (s *Server) targetError(ctx context.Context, base string, err error) error {
	var bad badReplyError
	switch {
	case errors.Is(err, egress.ErrRefused):
		var refused *egress.RefusedError
		if errors.As(err, &refused) {
			s.logger.WarnContext(ctx, "send target refused", slog.String("target", base), slog.String("addr", refused.Addr), slog.String("reason", refused.Reason))
		}
		return grpcerr.New(codes.InvalidArgument, "target "+base+" refused: internal address", "TARGET_REFUSED", Domain, nil)
	case errors.As(err, &bad):
		return grpcerr.New(codes.Unavailable, "target "+base+" "+bad.Error(), "TARGET_UNAVAILABLE", Domain, nil)
	}
	s.logger.InfoContext(ctx, "send target unreachable", slog.String("target", base), slog.Any("err", err))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return grpcerr.New(codes.Unavailable, "target "+base+" did not answer in time", "TARGET_UNAVAILABLE", Domain, nil)
	}
	return grpcerr.New(codes.Unavailable, "target "+base+" could not be reached", "TARGET_UNAVAILABLE", Domain, nil)
}
