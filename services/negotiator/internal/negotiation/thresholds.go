package negotiation

import (
	"fmt"
	"strconv"
	"strings"
)

// Thresholds are the conversation counts that trigger the next step for a
// (task, target) pair.
type Thresholds struct {
	// LookUpAfter: the sender looks for an existing PD after this many
	// conversations.
	LookUpAfter int
	// NegotiateAfter: the sender negotiates after this many.
	NegotiateAfter int
	// RequestNegotiationAfter: the receiver asks the sender to negotiate
	// after this many natural-language conversations.
	RequestNegotiationAfter int
	// RoutineOnUse: a routine is written on this use of a PD.
	RoutineOnUse int
}

// DefaultThresholds are the paper's (demo 2): 3, 5 and 10, and a routine on
// the 5th use of a PD.
var DefaultThresholds = Thresholds{LookUpAfter: 3, NegotiateAfter: 5, RequestNegotiationAfter: 10, RoutineOnUse: 5}

// ThresholdTable holds per-(task, target) overrides. "*" matches any task
// or target.
type ThresholdTable struct {
	Default   Thresholds
	overrides map[string]Thresholds
}

// MaxThreshold bounds each threshold: counts are sent as int32, and a
// conversation count beyond a million is a mistake, not a policy.
const MaxThreshold = 1_000_000

// ParseThresholds reads "task@target=3/5/10/5;..." (the last number may be
// omitted and defaults to 5), each number at most MaxThreshold. Task or
// target may be "*"; neither may contain "@", which would make the
// task@target keys ambiguous.
func ParseThresholds(s string) (ThresholdTable, error) {
	t := ThresholdTable{Default: DefaultThresholds, overrides: map[string]Thresholds{}}
	for item := range strings.SplitSeq(s, ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		key, vals, ok := strings.Cut(item, "=")
		task, target, ok2 := strings.Cut(key, "@")
		task, target = strings.TrimSpace(task), strings.TrimSpace(target)
		parts := strings.Split(vals, "/")
		if !ok || !ok2 || task == "" || target == "" || len(parts) < 3 || len(parts) > 4 {
			return t, fmt.Errorf("threshold %q: want task@target=lookup/negotiate/request[/routine]", item)
		}
		if strings.Contains(target, "@") {
			return t, fmt.Errorf("threshold %q: a task or target name must not contain @", item)
		}
		nums := []int{0, 0, 0, DefaultThresholds.RoutineOnUse}
		for i, p := range parts {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil || n < 0 || n > MaxThreshold {
				return t, fmt.Errorf("threshold %q: %q is not an integer from 0 to %d", item, p, MaxThreshold)
			}
			nums[i] = n
		}
		t.overrides[task+"@"+target] = Thresholds{nums[0], nums[1], nums[2], nums[3]}
	}
	return t, nil
}

// Lookup returns the thresholds for (task, target): an exact override, else
// task@*, else *@target, else *@*, else the defaults.
func (t ThresholdTable) Lookup(task, target string) Thresholds {
	for _, k := range []string{task + "@" + target, task + "@*", "*@" + target, "*@*"} {
		if th, ok := t.overrides[k]; ok {
			return th
		}
	}
	if t.Default == (Thresholds{}) {
		return DefaultThresholds
	}
	return t.Default
}
