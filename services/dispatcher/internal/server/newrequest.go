package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/protocolcontrol"
	"github.com/parleyhq/parley/services/dispatcher/internal/serviceprotocol"
)

// serviceRecipientType is the role a service request addresses.
const serviceRecipientType = "supplier"

// timeoutFields are NewRequest's timeout fields, each the body field it
// becomes.
var timeoutFields = []string{"proposal_timeout", "invite_offer_timeout", "offer_timeout"}

func requestTimeouts(req *dispatcherv1.NewRequestRequest) []*durationpb.Duration {
	return []*durationpb.Duration{req.GetProposalTimeout(), req.GetInviteOfferTimeout(), req.GetOfferTimeout()}
}

// NewRequest implements DispatcherService: it opens a service dialogue
// (category service) with the protocol's opener, whose body is the task,
// the timeouts in seconds, and the caller's further fields. The protocol's
// state machine then checks the opener per supplier like any message.
func (s *Server) NewRequest(ctx context.Context, req *dispatcherv1.NewRequestRequest) (*dispatcherv1.SendMessageResponse, error) {
	var v grpcerr.Violations
	checkSender(&v, req.GetSender())
	list := checkList(&v, req.GetTo())
	hash := req.GetProtocol()
	if p, ok := serviceprotocol.ByName(hash); ok {
		hash = p.Hash
	} else if !isHex40(hash) {
		v.Add("protocol", "must be delegate, allocate, transact, or the SHA-1 (40 lowercase hex) of a service protocol's PD")
	}
	body := map[string]json.RawMessage{}
	var task map[string]json.RawMessage
	switch raw := req.GetTaskJson(); {
	case raw == "":
		v.Add("task_json", "is required: the task, one JSON object")
	case json.Unmarshal([]byte(raw), &task) != nil || task == nil:
		v.Add("task_json", "must be one JSON object")
	default:
		body["task"] = json.RawMessage(raw)
	}
	if raw := req.GetBodyJson(); raw != "" {
		var extra map[string]json.RawMessage
		if err := json.Unmarshal([]byte(raw), &extra); err != nil || extra == nil {
			v.Add("body_json", "must be one JSON object")
		}
		for k, val := range extra {
			if k == "task" || slices.Contains(timeoutFields, k) {
				v.Add("body_json", fmt.Sprintf("may not set %s: it has a field of its own", k))
				continue
			}
			body[k] = val
		}
	}
	var timeouts []string
	for i, pd := range requestTimeouts(req) {
		name := timeoutFields[i]
		if pd == nil {
			continue
		}
		d := pd.AsDuration()
		if !pd.IsValid() || d <= 0 || d%time.Second != 0 {
			v.Add(name, "must be a positive whole number of seconds")
			continue
		}
		body[name] = json.RawMessage(strconv.FormatInt(int64(d/time.Second), 10))
		timeouts = append(timeouts, name)
	}
	if typ := req.GetMessageType(); typ != "" && !validToken(typ) {
		v.Add("message_type", "must be letters, digits, _ - or ., at most 64")
	}
	encoded, err := json.Marshal(body)
	if err != nil {
		return nil, s.toStatus(ctx, fmt.Errorf("encode the opener's body: %w", err)) // a bug: INTERNAL, never UNKNOWN
	}
	m := s.checkMessage(&v, "new_task_request", serviceRecipientType, string(encoded), req.GetRequestId())
	ctx, cancel, err := s.begin(ctx, v)
	if err != nil {
		return nil, err
	}
	defer cancel()

	machine, err := s.serviceMachine(ctx, hash)
	if err != nil {
		return nil, err
	}
	m.Type, m.Protocol = req.GetMessageType(), hash
	initial := machine.InitialTypes()
	switch {
	case m.Type == "" && len(initial) == 1:
		m.Type = initial[0]
	case m.Type == "":
		v.Add("message_type", fmt.Sprintf("is required: the protocol opens with any of %v", initial))
	case !machine.Initial(m.Type):
		v.Add("message_type", fmt.Sprintf("%s does not open the protocol; it opens with %v", m.Type, initial))
	}
	if m.Type != "" {
		declared := machine.DeadlineFields(m.Type)
		for _, name := range timeouts {
			if !slices.Contains(declared, name) {
				v.Add(name, fmt.Sprintf("the protocol's %s sets no %s (it sets %v)", m.Type, name, declared))
			}
		}
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	res, err := s.dialogues.Open(ctx, req.GetSender(), mailbox.CategoryService, list, m)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return sendResponse(res), nil
}

// errServiceProtocolsPending: a built-in service protocol the dispatcher
// is still registering at start (UNAVAILABLE: the caller retries).
var errServiceProtocolsPending = errors.New("the dispatcher is starting")

// serviceMachine returns the compiled state machine of a service protocol,
// or the status naming why hash is not one.
func (s *Server) serviceMachine(ctx context.Context, hash string) (*protocolcontrol.Machine, error) {
	pr, err := s.dir.Protocol(ctx, hash, nil)
	var v grpcerr.Violations
	switch {
	case errors.Is(err, directory.ErrNotFound) && s.builtinPending(hash):
		return nil, s.toStatus(ctx, fmt.Errorf("built-in service protocol %s is not registered with the registry yet (%w); retry", hash, errServiceProtocolsPending))
	case errors.Is(err, directory.ErrNotFound), errors.Is(err, directory.ErrRefused):
		v.Add("protocol", fmt.Sprintf("protocol %s is not known to the registry; register its PD first", hash))
	case err != nil:
		return nil, s.toStatus(ctx, fmt.Errorf("%w: %w", dialogue.ErrUnavailable, err))
	case pr.MachineErr != nil:
		v.Add("protocol", fmt.Sprintf("protocol %s declares a state machine that does not compile: %v", hash, pr.MachineErr))
	case pr.Machine == nil:
		v.Add("protocol", fmt.Sprintf("protocol %s declares no state machine, so it is not a service protocol", hash))
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	return pr.Machine, nil
}

// builtinPending reports whether hash is a built-in service protocol that
// is not registered yet.
func (s *Server) builtinPending(hash string) bool {
	if s.opts.ServiceProtocolsRegistered == nil || s.opts.ServiceProtocolsRegistered() {
		return false
	}
	for _, p := range serviceprotocol.Builtins() {
		if p.Hash == hash {
			return true
		}
	}
	return false
}
