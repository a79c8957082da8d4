// Package inbound is the dispatcher's receiving side: an Agora envelope
// for a hosted agent in, the reply out (Deliver), and Agent Protocol steps
// (Step). It follows the reference's handling flowchart (specs/agora.md,
// section 9): no protocol → natural-language handler; unsupported → the
// dialect's rejection; supported → routine, else connected handler, else
// LLM; a failed routine falls back to the handler and the LLM. It speaks
// plain Go types; internal/server adapts HTTP and gRPC to it.
package inbound

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/jsondepth"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/hub"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
	"github.com/parleyhq/parley/services/dispatcher/internal/negotiation"
	"github.com/parleyhq/parley/services/dispatcher/internal/pdschema"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/shadow"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Options configures a Pipeline. ConversationTTL and
// MaxConversationsPerPeer must be positive: the dispatcher's config owns
// their defaults and New substitutes none.
type Options struct {
	// ConversationTTL is the sliding lifetime of a conversation.
	ConversationTTL time.Duration
	// MaxConversationsPerPeer caps a peer's open conversations.
	MaxConversationsPerPeer int
	// PeerDialects fixes the reply dialect of some peers.
	PeerDialects map[string]agora.Dialect
	Now          func() time.Time
	Logger       *slog.Logger
	Metrics      *metrics.Metrics
}

// Pipeline answers envelopes and steps for hosted agents.
type Pipeline struct {
	store    store.Store
	dir      *directory.Directory
	routines *hosted.Set
	hub      *hub.Hub
	llm      llm.Counted
	shadows  *shadow.Runner
	neg      negotiation.Negotiator // nil: none
	opts     Options
}

// New returns a Pipeline. neg may be nil (no negotiations).
func New(st store.Store, dir *directory.Directory, routines *hosted.Set, h *hub.Hub, model llm.Counted, shadows *shadow.Runner, neg negotiation.Negotiator, opts Options) *Pipeline {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New(nil)
	}
	return &Pipeline{store: st, dir: dir, routines: routines, hub: h, llm: model, shadows: shadows, neg: neg, opts: opts}
}

// Envelope is one Agora HTTP request for a hosted agent.
type Envelope struct {
	Agent          string // clients/{c}/agents/{a}
	Peer           string // who sent it: the caller's address or a proxy's name for it
	ConversationID string // "" for a first message
	End            bool   // DELETE of the conversation
	JSON           []byte // the envelope; nil when End
}

// Reply is the HTTP reply to an envelope and the path that answered it
// ("" for the end of a conversation).
type Reply struct {
	Status int
	Body   []byte
	Path   string
}

// Answer is what the part of the pipeline that answers (routine, handler,
// LLM, negotiator) produced: a body and the conversation's new memory, or
// an error whose text is the one sentence the peer sees.
type Answer struct {
	Body   json.RawMessage
	Memory json.RawMessage
	Path   string
	Err    error
}

func failed(msg string) Answer { return Answer{Path: metrics.PathFailure, Err: errors.New(msg)} }

// failedWith is a failure that keeps the conversation's memory.
func failedWith(memory json.RawMessage, msg string) Answer {
	return Answer{Memory: memory, Path: metrics.PathFailure, Err: errors.New(msg)}
}

// Deliver answers one envelope. Agora errors travel in the reply, so it
// has no error of its own.
func (p *Pipeline) Deliver(ctx context.Context, e Envelope) Reply {
	start := time.Now()
	path, reply := p.deliver(ctx, e)
	if path != "" {
		p.opts.Metrics.Envelopes.WithLabelValues(path).Inc()
		p.opts.Metrics.EnvelopeSeconds.WithLabelValues(path).Observe(time.Since(start).Seconds())
	}
	return Reply{Status: reply.Status, Body: reply.Body, Path: path}
}

func (p *Pipeline) deliver(ctx context.Context, e Envelope) (string, agora.Reply) {
	peerDialect, peerFixed := p.opts.PeerDialects[e.Peer]
	followUp := e.ConversationID != ""
	if !directory.ValidAgentName(e.Agent) {
		return metrics.PathFailure, peerDialect.UnknownAgent()
	}
	agent, err := p.dir.Agent(ctx, e.Agent)
	if err != nil {
		if errors.Is(err, directory.ErrNotFound) {
			return metrics.PathFailure, peerDialect.UnknownAgent()
		}
		p.opts.Logger.WarnContext(ctx, "agent lookup failed; answering with a fault", slog.String("agent", e.Agent), slog.Any("err", err))
		return metrics.PathFailure, peerDialect.Fault("the agent directory is unavailable; retry later", followUp)
	}
	d := agent.Dialect
	if peerFixed {
		d = peerDialect
	}

	if e.End {
		return "", p.endConversation(ctx, e, d)
	}

	env, err := agora.Parse(e.JSON)
	if err != nil {
		return metrics.PathFailure, d.Malformed(err.Error())
	}
	if env.Form == agora.HashBase64 && !peerFixed {
		d = agora.Pylib
	}

	var conv *store.Conversation
	hexHash := env.HexHash()
	negotiating := env.Form == agora.HashNegotiation
	if id := e.ConversationID; id != "" {
		c, err := p.store.GetConversation(ctx, id)
		if errors.Is(err, store.ErrNotFound) || err == nil && (c.Agent != e.Agent || c.Peer != e.Peer) {
			// Another caller's conversation is reported as unknown: ids are
			// bound to their participants and reveal nothing.
			return metrics.PathFailure, d.UnknownConversation()
		}
		if err != nil {
			p.opts.Logger.ErrorContext(ctx, "conversation lookup failed", slog.Any("err", err))
			return metrics.PathFailure, d.Fault("internal error", followUp)
		}
		if !p.opts.Now().Before(c.ExpireTime) {
			return metrics.PathFailure, d.Failure("Conversation expired", nil)
		}
		if negotiating && c.ProtocolHash != negotiationKey || env.Hash != nil && hexHash != c.ProtocolHash {
			return metrics.PathFailure, d.Malformed("a follow-up must not change the conversation's protocol")
		}
		hexHash = c.ProtocolHash
		if hexHash == negotiationKey {
			hexHash, negotiating = "", true
		}
		conv = &c
	}

	query, bodyWasString := agora.Query(env.Body)
	var memIn json.RawMessage
	if conv != nil {
		memIn = conv.Memory
	}
	// answer runs the paid or sandboxed part. It runs only after a new
	// conversation's slot is reserved, so a peer at its cap costs nothing.
	var answer func() Answer
	switch {
	case hexHash == "" && negotiating && p.neg != nil:
		// The reference library's "negotiation" exchange: the negotiator
		// answers; FINALPROTOCOL ends it.
		answer = func() Answer { return p.answerNegotiation(ctx, agent, e.Peer, env.Body, memIn) }
	case hexHash == "":
		purpose := llm.PurposeReply
		if negotiating {
			purpose = llm.PurposeNegotiate
		}
		answer = func() Answer {
			a := p.answerNL(ctx, e.Agent, e.Peer, purpose, env.Body, conv)
			a.Memory = memIn
			return a
		}
	case hexHash == negotiation.PDHash && p.neg != nil && !agent.Unsupported[hexHash]:
		// Parley's negotiation PD: every hosted agent speaks it, through its
		// negotiator, with no registry lookup.
		answer = func() Answer { return p.answerNegotiation(ctx, agent, e.Peer, query, memIn) }
	default:
		// Support is decided by hash alone, so check it before resolving:
		// a protocol this agent would reject is never fetched, which keeps
		// outsiders from making the registry fetch their URLs through it.
		// The routine is looked up here once, for the check and the answer.
		r, rerr := p.routines.Get(ctx, e.Agent, hexHash)
		if rerr != nil {
			p.opts.Logger.WarnContext(ctx, "routine lookup failed; trying the handler and LLM", slog.String("agent", e.Agent), slog.Any("err", rerr))
			r = nil
		}
		if !p.supports(agent, hexHash, r) {
			return metrics.PathRejected, d.Unsupported(hashFor(env, hexHash))
		}
		pe, err := p.dir.Protocol(ctx, hexHash, env.Sources)
		if err != nil {
			if errors.Is(err, directory.ErrNotFound) || errors.Is(err, directory.ErrRefused) {
				return metrics.PathRejected, d.Unsupported(hashFor(env, hexHash))
			}
			p.opts.Logger.WarnContext(ctx, "protocol resolution failed; answering with a fault", slog.String("protocol", hexHash), slog.Any("err", err))
			return metrics.PathFailure, d.Fault("the protocol registry is unavailable; retry later", followUp)
		}
		if pe.SchemaErr != nil {
			return metrics.PathRejected, d.Unsupported(hashFor(env, hexHash))
		}
		if err := pdschema.Validate(pe.Schemas.Request, query); err != nil {
			return metrics.PathFailure, d.Failure(err.Error(), convRef(conv))
		}
		answer = func() Answer { return p.answerPD(ctx, e.Agent, e.Peer, pe, r, query, memIn, conv) }
	}

	if conv == nil && env.Multiround {
		// Reserve the peer's conversation slot before answering.
		now := p.opts.Now()
		key := hexHash
		if negotiating {
			key = negotiationKey
		}
		c := store.Conversation{
			ID:           newConversationID(),
			Agent:        e.Agent,
			Peer:         e.Peer,
			ProtocolHash: key,
			CreateTime:   now,
			ExpireTime:   now.Add(p.opts.ConversationTTL),
		}
		err := p.store.CreateConversation(ctx, c, p.opts.MaxConversationsPerPeer, now)
		if errors.Is(err, store.ErrLimit) {
			return metrics.PathFailure, d.Failure(fmt.Sprintf("Too many open conversations: at most %d per peer; end some with DELETE", p.opts.MaxConversationsPerPeer), nil)
		}
		if err != nil {
			p.opts.Logger.ErrorContext(ctx, "conversation create failed", slog.Any("err", err))
			return metrics.PathFailure, d.Fault("internal error", followUp)
		}
		a := answer()
		if a.Err != nil {
			// The first answer failed: release the slot.
			if err := p.store.DeleteConversation(context.WithoutCancel(ctx), c.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
				p.opts.Logger.ErrorContext(ctx, "conversation release failed", slog.Any("err", err))
			}
			return metrics.PathFailure, d.Failure(a.Err.Error(), nil)
		}
		if a.Memory != nil {
			err := p.store.UpdateConversation(ctx, c.ID, func(c *store.Conversation) error {
				c.Memory = a.Memory
				return nil
			})
			if err != nil {
				p.opts.Logger.ErrorContext(ctx, "conversation update failed", slog.Any("err", err))
				return metrics.PathFailure, d.Fault("internal error", followUp)
			}
		}
		ref := &agora.Conversation{ID: c.ID, Expires: c.ExpireTime.Unix()}
		return a.Path, d.Success(agora.BodyAs(a.Body, bodyWasString || d == agora.Pylib), ref)
	}

	a := answer()
	var ref *agora.Conversation
	if conv != nil {
		exp := p.opts.Now().Add(p.opts.ConversationTTL)
		err := p.store.UpdateConversation(ctx, conv.ID, func(c *store.Conversation) error {
			c.ExpireTime = exp
			if a.Memory != nil {
				c.Memory = a.Memory
			}
			return nil
		})
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			p.opts.Logger.ErrorContext(ctx, "conversation update failed", slog.Any("err", err))
			return metrics.PathFailure, d.Fault("internal error", followUp)
		}
		ref = &agora.Conversation{ID: conv.ID, Expires: exp.Unix()}
	}
	if a.Err != nil {
		return metrics.PathFailure, d.Failure(a.Err.Error(), ref)
	}
	return a.Path, d.Success(agora.BodyAs(a.Body, bodyWasString || d == agora.Pylib), ref)
}

// supports applies the agent's support policy to a protocol; r is the
// agent's routine for it (nil when it could not be looked up).
func (p *Pipeline) supports(a *directory.Agent, hexHash string, r *hosted.Routine) bool {
	if a.Unsupported[hexHash] {
		return false
	}
	if a.Supported[hexHash] {
		return true
	}
	if !a.Implemented {
		return false
	}
	return p.hub.Handler(a.Name, hexHash) != nil || r.Exists()
}

func convRef(c *store.Conversation) *agora.Conversation {
	if c == nil {
		return nil
	}
	return &agora.Conversation{ID: c.ID, Expires: c.ExpireTime.Unix()}
}

// hashFor spells a hash the way the request did.
func hashFor(env *agora.Envelope, hexHash string) string {
	if env.Form == agora.HashBase64 {
		return base64.StdEncoding.EncodeToString(env.Hash)
	}
	return hexHash
}

func (p *Pipeline) endConversation(ctx context.Context, e Envelope, d agora.Dialect) agora.Reply {
	c, err := p.store.GetConversation(ctx, e.ConversationID)
	if err == nil && c.Agent == e.Agent && c.Peer == e.Peer {
		err = p.store.DeleteConversation(ctx, c.ID)
	} else if err == nil {
		err = store.ErrNotFound
	}
	switch {
	case err == nil:
		return d.Ended()
	case errors.Is(err, store.ErrNotFound):
		if d == agora.Pylib {
			return d.Ended() // pylib: DELETE always answers 200
		}
		return d.UnknownConversation()
	default:
		p.opts.Logger.ErrorContext(ctx, "conversation delete failed", slog.Any("err", err))
		return d.Fault("internal error", true)
	}
}

// answerNL answers a natural-language envelope: the connected agent's
// natural-language handler, else the LLM, else a failure.
func (p *Pipeline) answerNL(ctx context.Context, agent, peer string, purpose llm.Purpose, body json.RawMessage, conv *store.Conversation) Answer {
	if c := p.hub.NL(agent); c != nil {
		out, err := p.callHandler(ctx, c, "", nil, body, conv)
		if err != nil {
			return Answer{Path: metrics.PathFailure, Err: err}
		}
		return Answer{Body: out, Path: metrics.PathHandler}
	}
	out, err := p.llm.Complete(ctx, p.routines.WithTools(ctx, llm.Request{Agent: agent, Peer: peer, Purpose: purpose, Input: body}))
	if errors.Is(err, llm.ErrNoLLM) {
		return failed("This agent cannot answer natural-language messages: it has no connected handler and no LLM is configured. Use a protocol it supports.")
	}
	if err != nil {
		return failed(llm.Failure(err))
	}
	return Answer{Body: out, Path: metrics.PathLLM}
}

// Sentences the peer gets when a routine did not answer (the detail goes
// to the routine's owner: the Routine resource and the log).
const (
	routineBadInput    = "This agent's routine could not use the request; check it against the protocol."
	routineFault       = "This agent's routine for the protocol failed."
	routineQuarantined = "This agent's routine for the protocol is quarantined after repeated failures"
)

// routineSentence is the one sentence the peer gets for a routine that did
// not answer; what went wrong in detail is the owner's (see hosted.Run).
func routineSentence(err error) string {
	switch {
	case errors.Is(err, hosted.ErrBadInput):
		return routineBadInput
	case errors.Is(err, routine.ErrBudget):
		return "This agent's routine for the protocol ran over its budget."
	case errors.Is(err, hosted.ErrBadOutput):
		return "This agent's routine gave a reply that does not fit the protocol."
	}
	return routineFault
}

// answerPD answers a supported protocol: routine r, else connected
// handler, else LLM reading the PD. A failed routine falls back to the
// handler and then the LLM.
//
// A reply may be the body's JSON value or a string holding a JSON object or
// list (what derived routines and the negotiator return); schemas check the
// JSON inside, and the dialect decides how it goes on the wire.
func (p *Pipeline) answerPD(ctx context.Context, agent, peer string, pe *directory.Protocol, r *hosted.Routine, query, memory json.RawMessage, conv *store.Conversation) Answer {
	hexHash := pe.Hash
	// check validates a reply once and returns it unwrapped.
	check := pe.Check
	var routineErr error
	if r.Usable() {
		mem := memory
		if mem == nil {
			mem = json.RawMessage("{}")
		}
		out, newMemory, err := p.routines.Run(ctx, r, hosted.Call{
			Fn: "reply", Args: []json.RawMessage{query}, Memory: mem, Check: check,
			InputChecked: pe.Schemas.Request != nil,
		})
		if err == nil {
			return Answer{Body: out, Memory: newMemory, Path: metrics.PathRoutine}
		}
		routineErr = err
	}
	if c := p.hub.Handler(agent, hexHash); c != nil {
		out, err := p.callHandler(ctx, c, hexHash, pe.Content, query, conv)
		if err == nil {
			out, err = check(out)
		}
		if err != nil {
			return Answer{Memory: memory, Path: metrics.PathFailure, Err: errors.New("The agent's handler failed: " + err.Error())}
		}
		return Answer{Body: out, Memory: memory, Path: metrics.PathHandler}
	}
	out, err := p.llm.Complete(ctx, p.routines.WithTools(ctx, llm.Request{Agent: agent, Peer: peer, Purpose: llm.PurposeReply, Protocol: pe.Content, Input: query}))
	fail := func(msg string) Answer { return failedWith(memory, msg) }
	switch {
	case err == nil:
		out, verr := check(out)
		if verr != nil {
			return fail("The language model's reply does not fit the protocol: " + verr.Error())
		}
		p.shadows.Run(ctx, agent, hexHash, shadow.Receiver, "reply", []json.RawMessage{query}, memory, out)
		return Answer{Body: out, Memory: memory, Path: metrics.PathLLM}
	case errors.Is(err, llm.ErrNoLLM) && routineErr != nil:
		return fail(routineSentence(routineErr))
	case errors.Is(err, llm.ErrNoLLM) && r.Quarantined():
		return fail(routineQuarantined + " and no LLM is configured to answer instead.")
	case errors.Is(err, llm.ErrNoLLM):
		return fail("This agent has no routine or connected handler for this protocol and no LLM is configured.")
	case routineErr != nil:
		return fail("This agent's routine for the protocol did not answer and the LLM fallback failed: " + llm.Failure(err))
	default:
		return fail(llm.Failure(err))
	}
}

func (p *Pipeline) callHandler(ctx context.Context, c *hub.Conn, hexHash string, pd []byte, body json.RawMessage, conv *store.Conversation) (json.RawMessage, error) {
	convID := ""
	if conv != nil {
		convID = conv.ID
	}
	r, err := c.Call(ctx, p.hub.Timeout(), func(id string, deadline *timestamppb.Timestamp) *dispatcherv1.ConnectResponse {
		return &dispatcherv1.ConnectResponse{Kind: &dispatcherv1.ConnectResponse_Envelope{Envelope: &dispatcherv1.EnvelopeRequest{
			RequestId: id, ProtocolHash: hexHash, BodyJson: body, ConversationId: convID, Deadline: deadline, ProtocolContent: pd,
		}}}
	})
	if err != nil {
		return nil, err
	}
	rep := r.GetEnvelopeReply()
	if rep.GetError() != "" {
		return nil, errors.New(rep.GetError())
	}
	out := json.RawMessage(rep.GetBodyJson())
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	if !json.Valid(out) {
		return nil, errors.New("the handler's body is not JSON")
	}
	if err := jsondepth.Check(out, jsondepth.Max); err != nil {
		return nil, fmt.Errorf("the handler's body: %w", err)
	}
	return out, nil
}

// newConversationID returns 128 random bits, URL-safe base64 (22 chars).
func newConversationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// negotiationKey is the ProtocolHash of conversations running the reference
// library's "negotiation" exchange.
const negotiationKey = "negotiation"
