package protocolcontrol

import (
	"fmt"
	"strings"
	"time"
)

// Rule names a rule of a state machine. The values are stable and
// UPPER_SNAKE, fit for an ErrorInfo reason or a protocol_error body.
type Rule string

// The rules Check enforces, in the order it checks them.
const (
	RuleUnknownType     Rule = "UNKNOWN_MESSAGE_TYPE"
	RuleNotInitial      Rule = "NOT_AN_OPENER"
	RulePairEnded       Rule = "PAIR_ENDED"
	RuleWrongRole       Rule = "WRONG_ROLE"
	RuleNotAllowedAfter Rule = "NOT_ALLOWED_AFTER"
	RuleNotAnAnswer     Rule = "NOT_AN_ANSWER"
	RuleDeadlinePassed  Rule = "DEADLINE_PASSED"
	RuleSchema          Rule = "SCHEMA"
)

// Violation is a message that breaks its pair's state machine. Only the
// fields its Rule uses are set.
type Violation struct {
	Rule Rule
	Type string // the refused message's type

	Role    string   // RuleWrongRole: the sender's role
	Allowed []string // RuleWrongRole: roles that may send Type; RuleNotAllowedAfter, RuleNotAnAnswer: the types allowed
	State   string   // RuleNotAllowedAfter, RulePairEnded: the pair's current state
	Answers string   // RuleNotAnAnswer, RuleNotInitial: the type the message answers

	Outcome Outcome // RulePairEnded: how the pair ended
	Expired string  // RulePairEnded: the deadline whose expiry ended the pair, if one did

	Deadline   string    // RuleDeadlinePassed: the deadline's name
	DeadlineAt time.Time // RuleDeadlinePassed: when it passed

	Path   string // RuleSchema: JSON pointer into the body ("" for the whole body)
	Detail string // RuleSchema: what is wrong there
}

// Error is one sentence naming the rule broken.
func (v *Violation) Error() string {
	switch v.Rule {
	case RuleUnknownType:
		return fmt.Sprintf("message type %q is not part of the protocol", v.Type)
	case RuleNotInitial:
		if v.Answers != "" {
			return fmt.Sprintf("%q cannot open a dialogue while answering %q", v.Type, v.Answers)
		}
		return fmt.Sprintf("%q cannot open this dialogue: only the initiator sends an opener, and %q is not one", v.Type, v.Type)
	case RulePairEnded:
		s := fmt.Sprintf("%q is refused: this pair of the dialogue has ended after %q", v.Type, v.State)
		if v.Expired != "" {
			s = fmt.Sprintf("%q is refused: this pair of the dialogue ended when %s expired", v.Type, v.Expired)
		}
		if v.Outcome != OutcomeNone {
			s += " (" + string(v.Outcome) + ")"
		}
		return s
	case RuleWrongRole:
		return fmt.Sprintf("%q may be sent by %s, not by %s", v.Type, strings.Join(v.Allowed, " or "), v.Role)
	case RuleNotAllowedAfter:
		return fmt.Sprintf("%q is not allowed after %q; allowed: %s", v.Type, v.State, list(v.Allowed))
	case RuleNotAnAnswer:
		return fmt.Sprintf("%q cannot answer %q; it answers: %s", v.Type, v.Answers, list(v.Allowed))
	case RuleDeadlinePassed:
		return fmt.Sprintf("%q arrived after %s passed at %s", v.Type, v.Deadline, v.DeadlineAt.UTC().Format(time.RFC3339))
	case RuleSchema:
		return fmt.Sprintf("%q body at %q: %s", v.Type, v.Path, v.Detail)
	}
	return fmt.Sprintf("%q breaks rule %s", v.Type, v.Rule)
}

func list(types []string) string {
	if len(types) == 0 {
		return "nothing"
	}
	return strings.Join(types, ", ")
}
