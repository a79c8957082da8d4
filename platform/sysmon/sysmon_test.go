package sysmon_test

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/parleyhq/parley/platform/sysmon"
)

// reexecHelper makes the test binary a program that calls Reexec and
// prints its PID and GODEBUG: what TestReexec_sameProcessWithTheSetting
// runs.
const reexecHelper = "SYSMON_TEST_REEXEC"

func TestMain(m *testing.M) {
	if os.Getenv(reexecHelper) != "" {
		if err := sysmon.Reexec(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("pid=%d godebug=%s args=%s\n", os.Getpid(), os.Getenv("GODEBUG"), strings.Join(os.Args[1:], " "))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestEnv_addsTheSettingUnlessSchedtraceIsNamed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []string
		want    []string
		changed bool
	}{
		{"no GODEBUG", []string{"A=1"}, []string{"A=1", "GODEBUG=" + sysmon.Setting}, true},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, []string{"GODEBUG=" + sysmon.Setting, "A=1"}, true},
		{"other settings kept", []string{"GODEBUG=gctrace=1", "A=1"}, []string{"GODEBUG=gctrace=1," + sysmon.Setting, "A=1"}, true},
		{"schedtrace set: left alone", []string{"GODEBUG=gctrace=1,schedtrace=1000"}, []string{"GODEBUG=gctrace=1,schedtrace=1000"}, false},
		{"schedtrace=0 opts out", []string{"GODEBUG=schedtrace=0"}, []string{"GODEBUG=schedtrace=0"}, false},
		{"a duplicate GODEBUG dropped", []string{"GODEBUG=a=1", "GODEBUG=b=1"}, []string{"GODEBUG=a=1," + sysmon.Setting}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.in)
			got, changed := sysmon.Env(in)
			if !slices.Equal(got, tc.want) || changed != tc.changed {
				t.Errorf("Env(%q) = %q, %v; want %q, %v", tc.in, got, changed, tc.want, tc.changed)
			}
			if !slices.Equal(in, tc.in) {
				t.Errorf("Env(%q) changed its argument to %q", tc.in, in)
			}
		})
	}
}

// A process that calls Reexec must go on as the same process (same PID
// and arguments) with the setting in GODEBUG, and a process whose GODEBUG
// names schedtrace must be left as it is.
func TestReexec_sameProcessWithTheSetting(t *testing.T) {
	for _, tc := range []struct {
		name    string
		godebug string // "" for none
		want    string
	}{
		{"added", "", sysmon.Setting},
		{"added to others", "gctrace=0", "gctrace=0," + sysmon.Setting},
		{"opted out", "schedtrace=0", "schedtrace=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$", "extra-arg")
			cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") }), reexecHelper+"=1")
			if tc.godebug != "" {
				cmd.Env = append(cmd.Env, "GODEBUG="+tc.godebug)
			}
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("helper process: %v; output %q", err, out.String())
			}
			want := fmt.Sprintf("pid=%s godebug=%s args=-test.run=^$ extra-arg\n", strconv.Itoa(cmd.Process.Pid), tc.want)
			if out.String() != want {
				t.Errorf("helper printed %q, want %q", out.String(), want)
			}
		})
	}
}
