package negotiation_test

import (
	"strings"
	"testing"

	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
)

// Huge values would wrap negative as the int32 of GetThresholds.
func TestParseThresholds_rejectsValuesAboveTheMax(t *testing.T) {
	for _, bad := range []string{"a@b=1/2/3000000000", "a@b=1/2/3/1000001", "a@b=99999999999999999999/1/1"} {
		if _, err := negotiation.ParseThresholds(bad); err == nil {
			t.Errorf("ParseThresholds(%q) succeeded", bad)
		}
	}
	tab, err := negotiation.ParseThresholds("a@b=1000000/0/1000000/1000000")
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.Lookup("a", "b"); got.LookUpAfter != negotiation.MaxThreshold || got.RoutineOnUse != negotiation.MaxThreshold {
		t.Errorf("Lookup = %v, want the max kept", got)
	}
}

// "a@b@c" could be task a at target b@c or task a@b at target c.
func TestParseThresholds_rejectsAtInNames(t *testing.T) {
	for _, bad := range []string{"a@b@c=1/2/3", "a@@c=1/2/3", "*@b@c=1/2/3"} {
		_, err := negotiation.ParseThresholds(bad)
		if err == nil || !strings.Contains(err.Error(), "@") {
			t.Errorf("ParseThresholds(%q) = %v, want an error about @", bad, err)
		}
	}
}
