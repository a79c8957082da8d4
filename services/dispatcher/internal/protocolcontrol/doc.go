// Package protocolcontrol enforces a protocol document's state machine on the
// server, one (dialogue, counterpart) pair at a time.
//
// A PD's stateMachine is parsed and validated by the registry and arrives as
// registryv1.StateMachine; docs/state-machines.md describes the format. This
// package compiles it into a Machine and checks each message against the
// state of its pair. It is plain Go: no gRPC, no storage, no clock of its own.
//
// # API (stable; the dialogue send path calls it)
//
//	m, err := protocolcontrol.Compile(sm)          // once per PD hash
//	res, err := m.Check(pairState, protocolcontrol.Input{
//		Sender:      protocolcontrol.Initiator,    // or Counterpart
//		Type:        "offer",
//		AnswersType: "new_task_request",           // "" for the dialogue's opener
//		Body:        body,                         // one JSON value
//		Now:         now,
//	})
//	// err is a *Violation (errors.As) naming the rule broken, or nil:
//	// store res.State as the pair's new state, deliver res.Body (deadline
//	// fields rewritten to absolute times) and arm res.Deadlines.
//	res, fired, err := m.Expire(pairState, "offer_timeout", now) // a timer fired
//	p, err := protocolcontrol.InspectAt(pairState, now) // a stored state, as it stands at now
//
// pairState is the opaque state (a compact binary form; JSON when stored
// by a release before it, still read) that the previous Check or Expire returned for
// this pair, or nil for a pair that has no message yet. The caller stores it
// with the dialogue and serialises calls per dialogue: Check is a pure
// function of its arguments, so two concurrent sends on one pair must not
// both start from the same state.
//
// # Roles
//
// A pair is the dialogue's initiator and one counterpart. The opener (a
// message with an empty pair state) must be one of the machine's initial
// types and be sent by the initiator; the initiator then holds that type's
// first sender role for the whole dialogue, and the counterpart the type's
// receiver role or, when the machine has exactly two roles, the other one.
// For the service protocols that makes the consumer the initiator and every
// recipient of new_task_request a supplier. Callers say which side sent a
// message (Initiator or Counterpart), never a role, so a client cannot claim
// one.
//
// # Rules, in the order they are checked
//
//  1. the type is declared (RuleUnknownType);
//  2. an opener is an initial type sent by the initiator, answering nothing
//     (RuleNotInitial); for a later message, no pending deadline has
//     passed unmet: one that guards the type refuses it
//     (RuleDeadlinePassed), any other has ended the pair (RulePairEnded,
//     naming it); and the pair has not ended (RulePairEnded);
//  3. the sender's role may send the type (RuleWrongRole);
//  4. unless the type is alwaysAllowed, it may follow the pair's current
//     state (RuleNotAllowedAfter) and may answer the type it answers
//     (RuleNotAnAnswer);
//  5. the body matches the type's schema (RuleSchema, with the JSON pointer
//     of the failure), and each deadline field is a positive number of
//     seconds no longer than its max (RuleSchema at that field).
//
// Accepting a message makes its type the pair's state, meets the deadlines
// that guard it, sets the deadlines it declares (replacing pending ones of
// the same name), records its outcome, and marks the pair as holding an
// order when the type is opensOrder (Result.OpensOrder tells the caller to
// form the order record). A pair whose state has no
// transitions has ended: every later message is refused, and its pending
// deadlines are dropped. A deadline that passes before it is met ends its
// pair with a failure at that instant: Check and InspectAt read the stored
// state so whether or not a timer has fired, and Expire (the timer firing)
// reports the end once, for the expiry message, without a write.
package protocolcontrol
