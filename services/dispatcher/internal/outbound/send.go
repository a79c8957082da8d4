// Package outbound sends a hosted agent's queries to other Agora agents:
// Send picks a protocol (the target's well-known document, our sender
// routines, the PDs' metadata, the LLM's judgement), has a routine or the
// LLM write the body, posts it in the target's dialect, reads the reply,
// and negotiates a protocol when the thresholds say so. The HTTP client
// (guarded by platform/egress in production) and the negotiator sit behind
// small interfaces; internal/server maps this package's errors to statuses.
package outbound

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
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/parleyhq/parley/platform/egress"
	"github.com/parleyhq/parley/platform/jsondepth"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/cache"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/fault"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
	"github.com/parleyhq/parley/services/dispatcher/internal/negotiation"
	"github.com/parleyhq/parley/services/dispatcher/internal/shadow"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Errors of Send; each error from it wraps one, and its text is fit for
// the caller.
var (
	// ErrUnknownAgent: the sending agent is not registered.
	ErrUnknownAgent = errors.New("unknown sending agent")
	// ErrUnknownProtocol: the forced or picked protocol does not resolve.
	ErrUnknownProtocol = errors.New("unknown protocol")
	// ErrRegistry: the registry could not be reached.
	ErrRegistry = errors.New("registry unavailable")
	// ErrNoSender: no sender routine and no LLM for the protocol.
	ErrNoSender = errors.New("no sender")
	// ErrTargetRefused: the target resolves to an internal address.
	ErrTargetRefused = errors.New("target refused")
	// ErrTargetUnavailable: the target could not be reached or answered
	// with something that is not an Agora reply.
	ErrTargetUnavailable = errors.New("target unavailable")
	// ErrLLM: the LLM could not write the message (ErrLLMBudget is
	// wrapped too when that is why).
	ErrLLM = errors.New("LLM failed")
)

// fail is fault.New, the core's caller-facing error.
var fail = fault.New

// Client sends HTTP requests: *http.Client, guarded in production.
type Client interface {
	Do(*http.Request) (*http.Response, error)
}

// Options configures a Sender. Timeout and MaxListed must be
// positive: the dispatcher's config owns their defaults and New
// substitutes none.
type Options struct {
	// PublicURL is our HTTP side's public base URL, for protocolSources.
	PublicURL string
	// Timeout bounds one outbound HTTP attempt; it must be positive.
	Timeout time.Duration
	// Retries is how many times a safe-to-retry send is retried; zero
	// sends once.
	Retries int
	// MaxListed is how many of the protocols a target's well-known
	// document lists Send resolves at most (in hash order).
	MaxListed int
	// MaxJudge caps the LLM calls one Send spends judging whether a
	// listed protocol fits its task; zero judges none (config owns the
	// default).
	MaxJudge int
	// CacheTTL is how long well-known documents are cached (at least 30 s).
	CacheTTL time.Duration
	Now      func() time.Time
	Logger   *slog.Logger
	Metrics  *metrics.Metrics
}

// Sender sends envelopes for hosted agents.
type Sender struct {
	client    Client
	dir       *directory.Directory
	routines  *hosted.Set
	shadows   *shadow.Runner
	llm       llm.Counted
	store     store.Store
	neg       negotiation.Negotiator // nil: none
	opts      Options
	wellknown *cache.Cache[map[string][]string]
	// pickMisses remembers, per target, listed protocols that did not
	// resolve or that the LLM judged unfit for a task, for 10 minutes.
	pickMisses *cache.ExpirySet
	backoff    negotiationBackoff

	negPDMu sync.Mutex // guards negPD
	negPD   []byte     // the negotiation PD, once fetched from the negotiator
}

// New returns a Sender. neg may be nil (no negotiations).
func New(client Client, dir *directory.Directory, routines *hosted.Set, shadows *shadow.Runner, model llm.Counted, st store.Store, neg negotiation.Negotiator, opts Options) *Sender {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New(nil)
	}
	return &Sender{
		client: client, dir: dir, routines: routines, shadows: shadows, llm: model, store: st, neg: neg, opts: opts,
		wellknown:  cache.New[map[string][]string](max(opts.CacheTTL, 30*time.Second), opts.Now),
		pickMisses: cache.NewExpirySet(10*time.Minute, opts.Now),
	}
}

// Request is one Send. Exactly one of Task and Text is set; the caller
// has validated it.
type Request struct {
	Agent     string
	TargetURL string
	Task      string
	Text      string
	// TaskData is the task's JSON input; nil for none.
	TaskData        json.RawMessage
	TaskDescription string
	// InputSchema and OutputSchema are JSON Schemas; nil when not given.
	InputSchema, OutputSchema json.RawMessage
	// ProtocolHash forces a protocol (40 lowercase hex); "" picks one.
	ProtocolHash string
	Dialect      agora.Dialect
}

// Result is the outcome of a Send the target answered.
type Result struct {
	Status       string // the reply's status
	Body         json.RawMessage
	ProtocolHash string
	Path         string // routine, llm or text
	Error        string // the reply's error text
	Negotiation  string // the negotiation this Send ran first, if any
}

// maxReplyBytes caps a peer's reply and /wellknown document.
const maxReplyBytes = 1 << 20

// Send sends req in the reference's order of picking a protocol
// (specs/agora.md, section 9): one the target lists in its well-known
// document that we hold a sender routine for; else one it lists whose
// metadata fits the task; else one we hold a sender routine for whose
// metadata fits; else one it lists that the LLM judges fit; else natural
// language.
func (s *Sender) Send(ctx context.Context, req Request) (Result, error) {
	agent := req.Agent
	if _, err := s.dir.Agent(ctx, agent); err != nil {
		return Result{}, referenceError(err, ErrUnknownAgent, "agent "+agent)
	}
	base := strings.TrimSuffix(req.TargetURL, "/")

	if req.Text != "" {
		body, _ := json.Marshal(req.Text)
		rep, err := s.post(ctx, base, req.Dialect, "", nil, body)
		if err != nil {
			return Result{}, err
		}
		s.countSend(ctx, agent, "", base, false)
		s.opts.Metrics.Sends.WithLabelValues(metrics.PathText).Inc()
		return Result{Status: rep.status, Body: rep.body, Path: metrics.PathText, Error: rep.err}, nil
	}

	taskData := req.TaskData
	if len(taskData) == 0 {
		taskData = json.RawMessage("null")
	}
	hexHash := req.ProtocolHash
	var negName string
	if hexHash == "" {
		hexHash = s.pickProtocol(ctx, agent, req.Task, base)
		if hexHash == "" || !s.routines.HasSender(ctx, agent, hexHash) {
			var agreed string
			if agreed, negName = s.maybeNegotiate(ctx, agent, base, req, hexHash); agreed != "" {
				hexHash = agreed
			}
		}
	}
	if hexHash == "" {
		// No protocol fits: natural language, written by the LLM when there
		// is one, else the task data itself.
		body, err := s.llm.Complete(ctx, taskLLM(llm.Request{Agent: agent, Peer: base, Purpose: llm.PurposeSend, Input: taskData}, req))
		path := metrics.PathLLM
		if errors.Is(err, llm.ErrNoLLM) {
			body, path = taskData, metrics.PathText
		} else if err != nil {
			return Result{}, sendLLMError(err)
		}
		rep, err := s.post(ctx, base, req.Dialect, "", nil, body)
		if err != nil {
			return Result{}, err
		}
		s.countSend(ctx, agent, req.Task, base, false)
		s.opts.Metrics.Sends.WithLabelValues(path).Inc()
		return Result{Status: rep.status, Body: rep.body, Path: path, Error: rep.err, Negotiation: negName}, nil
	}

	pe, err := s.dir.Protocol(ctx, hexHash, nil)
	if err != nil {
		return Result{}, referenceError(err, ErrUnknownProtocol, "protocol "+hexHash)
	}
	r, rerr := s.routines.Get(ctx, agent, hexHash)
	hasRoutine := rerr == nil && r.Ready()
	path := metrics.PathRoutine
	var body json.RawMessage
	if hasRoutine && r.Has("send") {
		// A failed routine leaves body nil and the LLM writes it instead;
		// Run has already recorded the failure.
		body, _, _ = s.routines.Run(ctx, r, hosted.Call{Fn: "send", Args: []json.RawMessage{taskData}, InputChecked: true})
	}
	if body == nil {
		path = metrics.PathLLM
		body, err = s.llm.Complete(ctx, taskLLM(llm.Request{Agent: agent, Peer: base, Purpose: llm.PurposeSend, Protocol: pe.Content, Input: taskData}, req))
		if errors.Is(err, llm.ErrNoLLM) {
			return Result{}, fail(ErrNoSender, fmt.Sprintf("agent %s has no sender routine for protocol %s and no LLM is configured", agent, hexHash))
		}
		if err != nil {
			return Result{}, sendLLMError(err)
		}
		s.shadows.Run(ctx, agent, hexHash, shadow.Sender, "send", []json.RawMessage{taskData}, nil, body)
	}
	rep, err := s.post(ctx, base, req.Dialect, hexHash, pe.Content, body)
	if err != nil {
		return Result{}, err
	}
	s.countSend(ctx, agent, req.Task, base, true)
	result := rep.body
	if rep.status == "success" {
		result, path = s.parseReply(ctx, agent, r, hasRoutine, pe, req, base, rep.body, path)
	}
	s.opts.Metrics.Sends.WithLabelValues(path).Inc()
	return Result{Status: rep.status, Body: result, ProtocolHash: hexHash, Path: path, Error: rep.err, Negotiation: negName}, nil
}

// referenceError translates a directory error about something a Send
// refers to: not registered is kind, an unreachable registry ErrRegistry.
func referenceError(err, kind error, what string) error {
	switch {
	case errors.Is(err, directory.ErrNotFound), errors.Is(err, directory.ErrRefused):
		return fail(kind, what+" is not registered")
	case errors.Is(err, directory.ErrUnavailable):
		return fail(ErrRegistry, what+": registry unavailable, retry later")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// taskLLM adds the Send's task description and schemas to an LLM request.
func taskLLM(l llm.Request, req Request) llm.Request {
	l.Task, l.TaskDescription = req.Task, req.TaskDescription
	l.InputSchema, l.OutputSchema = req.InputSchema, req.OutputSchema
	return l
}

// sendLLMError is Send's error when the LLM could not write a message.
func sendLLMError(err error) error {
	if errors.Is(err, llm.ErrLLMBudget) {
		return fault.New(err, err.Error())
	}
	return fail(ErrLLM, "the language model could not write the message: "+err.Error())
}

// parseReply reads a successful reply with the routine's parse, else the
// LLM when parse fails, else returns the body as is.
func (s *Sender) parseReply(ctx context.Context, agent string, r *hosted.Routine, hasRoutine bool, pe *directory.Protocol, req Request, base string, body json.RawMessage, path string) (json.RawMessage, string) {
	query, _ := agora.Query(body)
	if !hasRoutine || !r.Has("parse") {
		return query, path
	}
	out, _, err := s.routines.Run(ctx, r, hosted.Call{Fn: "parse", Args: []json.RawMessage{query}})
	if err == nil {
		return out, path
	}
	out, lerr := s.llm.Complete(ctx, taskLLM(llm.Request{Agent: agent, Peer: base, Purpose: llm.PurposeParse, Protocol: pe.Content, Input: query}, req))
	if lerr != nil {
		return query, path
	}
	if path != metrics.PathLLM { // at most one shadow run per Send: none ran for send
		s.shadows.Run(ctx, agent, pe.Hash, shadow.Sender, "parse", []json.RawMessage{query}, nil, out)
	}
	return out, metrics.PathLLM
}

func (s *Sender) countSend(ctx context.Context, agent, task, target string, withProtocol bool) {
	if err := s.store.CountSend(context.WithoutCancel(ctx), agent, task, target, withProtocol); err != nil {
		s.opts.Logger.WarnContext(ctx, "send not counted", slog.Any("err", err))
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
func (s *Sender) pickProtocol(ctx context.Context, agent, task, base string) string {
	listed := s.targetProtocols(ctx, base)
	hashes := make([]string, 0, len(listed))
	for h := range listed {
		hashes = append(hashes, h)
	}
	sort.Strings(hashes)
	hasSender := func(h string) bool { return s.routines.HasSender(ctx, agent, h) }
	own := s.routines.Hashes(ctx, agent) // hashes we hold a routine for
	ownSet := map[string]bool{}
	for _, h := range own {
		ownSet[h] = true
	}
	for _, h := range hashes {
		if ownSet[h] && hasSender(h) {
			return h
		}
	}
	// PDs we already hold cost nothing to read; of the others, only those
	// among the first SendMaxListed listed are resolved.
	var resolved []*directory.Protocol
	for i, h := range hashes {
		pe, ok := s.dir.PeekProtocol(h)
		if ok {
			if fits(pe, task) {
				return h
			}
			resolved = append(resolved, pe)
			continue
		}
		if i >= s.opts.MaxListed {
			continue
		}
		missKey := base + "\x00" + h
		if s.pickMisses.Has(missKey) {
			continue
		}
		pe, err := s.dir.Protocol(ctx, h, listed[h])
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, directory.ErrUnavailable) {
				s.pickMisses.Add(missKey)
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
			if pe, err := s.dir.Protocol(ctx, h, nil); err == nil && fits(pe, task) {
				return h
			}
		}
	}
	judged := 0
	for _, pe := range resolved {
		if judged >= s.opts.MaxJudge {
			break
		}
		h := pe.Hash
		missKey := base + "\x00" + h + "\x00" + task
		if !related(pe, task) || s.pickMisses.Has(missKey) {
			continue
		}
		judged++
		out, err := s.llm.Complete(ctx, llm.Request{Agent: agent, Peer: base, Purpose: llm.PurposeJudge, Protocol: pe.Content, Task: task})
		if errors.Is(err, llm.ErrNoLLM) || errors.Is(err, llm.ErrLLMBudget) {
			break
		}
		if err == nil && string(bytes.TrimSpace(out)) == "true" {
			return h
		}
		if err == nil {
			s.pickMisses.Add(missKey)
		}
	}
	return ""
}

// related is the cheap check before asking the LLM whether a PD fits: some
// word of the task (four letters or more) occurs in the PD's title,
// description or tags, ignoring case.
func related(pe *directory.Protocol, task string) bool {
	meta := strings.ToLower(pe.Title + " " + pe.Description + " " + strings.Join(pe.Tags, " "))
	for _, w := range strings.FieldsFunc(strings.ToLower(task), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if len(w) >= 4 && strings.Contains(meta, w) {
			return true
		}
	}
	return false
}

// fits reports whether a PD's metadata names the task: its title, a tag or
// its description contains the task name, ignoring case, - and _.
func fits(pe *directory.Protocol, task string) bool {
	norm := func(s string) string {
		return strings.NewReplacer("-", " ", "_", " ").Replace(strings.ToLower(s))
	}
	t := norm(task)
	if t == "" {
		return false
	}
	if strings.Contains(norm(pe.Title), t) || strings.Contains(norm(pe.Description), t) {
		return true
	}
	for _, tag := range pe.Tags {
		if norm(tag) == t {
			return true
		}
	}
	return false
}

// targetProtocols fetches the target's discovery document: {base}/.wellknown,
// else {base}/wellknown, in the std, extended or paper shape. Failures give
// an empty map.
func (s *Sender) targetProtocols(ctx context.Context, base string) map[string][]string {
	m, err := s.wellknown.Get(ctx, base, func(ctx context.Context) (map[string][]string, error) {
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

func (s *Sender) fetchWellknown(ctx context.Context, u string) (map[string][]string, bool) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
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
func (s *Sender) post(ctx context.Context, base string, d agora.Dialect, hexHash string, pd []byte, body json.RawMessage) (peerReply, error) {
	return s.postTo(ctx, base, d, hexHash, pd, body, false)
}

// postTo is post to any URL (a base or a conversation), multiround or not.
func (s *Sender) postTo(ctx context.Context, base string, d agora.Dialect, hexHash string, pd []byte, body json.RawMessage, multiround bool) (peerReply, error) {
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
		return peerReply{}, err
	}
	var lastErr error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(time.Duration(100<<attempt) * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return peerReply{}, ctx.Err()
			case <-t.C:
			}
		}
		rep, err := s.postOnce(ctx, base, data)
		if err == nil {
			return rep, nil
		}
		lastErr = err
		var op *net.OpError
		if attempt >= s.opts.Retries || errors.Is(err, egress.ErrRefused) || !errors.As(err, &op) || op.Op != "dial" {
			break
		}
	}
	if ctx.Err() != nil {
		return peerReply{}, ctx.Err()
	}
	return peerReply{}, s.targetError(ctx, base, lastErr)
}

func (s *Sender) postOnce(ctx context.Context, u string, data []byte) (peerReply, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
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

// badReplyError is a peer's answer that is not an Agora reply.
type badReplyError struct{ status int }

func (e badReplyError) Error() string {
	return fmt.Sprintf("answered HTTP %d with a reply that is not JSON", e.status)
}

// targetError is Send's error for a target that could not be used. The
// caller named the target, so the message never carries what our resolver
// or network said (addresses, resolver, internal names); that goes to the
// log.
func (s *Sender) targetError(ctx context.Context, base string, err error) error {
	var bad badReplyError
	switch {
	case errors.Is(err, egress.ErrRefused):
		var refused *egress.RefusedError
		if errors.As(err, &refused) {
			s.opts.Logger.WarnContext(ctx, "send target refused", slog.String("target", base), slog.String("addr", refused.Addr), slog.String("reason", refused.Reason))
		}
		return fail(ErrTargetRefused, "target "+base+" refused: internal address")
	case errors.As(err, &bad):
		return fail(ErrTargetUnavailable, "target "+base+" "+bad.Error())
	}
	s.opts.Logger.InfoContext(ctx, "send target unreachable", slog.String("target", base), slog.Any("err", err))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fail(ErrTargetUnavailable, "target "+base+" did not answer in time")
	}
	return fail(ErrTargetUnavailable, "target "+base+" could not be reached")
}
