package resource

import (
	"errors"
	"fmt"
	"testing"
)

func TestError_carriesKindAndMatchesSentinel(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		sentinel   error
		wantReason string
		wantMsg    string
	}{
		{"not found", NotFound("routine candidate", "routineCandidates/x"), ErrNotFound, "ROUTINE_CANDIDATE_NOT_FOUND", `routine candidate "routineCandidates/x" does not exist`},
		{"already exists", AlreadyExists("task", "tasks/t"), ErrAlreadyExists, "TASK_ALREADY_EXISTS", `task "tasks/t" already exists`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := fmt.Errorf("load: %w", tt.err)
			if !errors.Is(err, tt.sentinel) {
				t.Errorf("errors.Is(%v, %v) = false, want true", err, tt.sentinel)
			}
			var re *Error
			if !errors.As(err, &re) {
				t.Fatalf("errors.As(%v, *Error) = false, want true", err)
			}
			if got := re.Reason(); got != tt.wantReason {
				t.Errorf("Reason() = %q, want %q", got, tt.wantReason)
			}
			if got := re.Error(); got != tt.wantMsg {
				t.Errorf("Error() = %q, want %q", got, tt.wantMsg)
			}
		})
	}
	if got, want := (&Error{Kind: "routine candidate"}).MetadataKey(), "routine_candidate"; got != want {
		t.Errorf("MetadataKey() = %q, want %q", got, want)
	}
}

func TestID(t *testing.T) {
	for name, want := range map[string]string{
		"tasks/t1/steps/s1": "s1",
		"agents/a":          "a",
		"plain":             "plain",
		"trailing/":         "",
		"":                  "",
	} {
		if got := ID(name); got != want {
			t.Errorf("ID(%q) = %q, want %q", name, got, want)
		}
	}
}
