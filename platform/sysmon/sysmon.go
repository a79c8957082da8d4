// Package sysmon keeps the Go runtime's system monitor (sysmon) out of its
// deep sleep, which costs a server that goes idle between requests many
// thread switches per request.
//
// Sysmon sleeps until woken whenever every P is idle. The next goroutine
// to enter a system call wakes it, and it restarts polling every 20 µs
// (about 70 µs with Linux's timer slack), doubling its sleep only after
// 1 ms without work to do. A server answering one client at a time goes
// idle between requests, so each request restarts that polling, for as
// long as any P is busy: through every fdatasync too. On a virtual
// machine each wakeup is a costly thread switch: at one sender of direct
// messages, sysmon's wakeups were 38% of `parley serve`'s switches and a
// quarter of its CPU (docs/benchmarks.md, "one sender: CPU per
// message").
//
// The runtime has no setting for this but one side effect: with GODEBUG
// schedtrace set, sysmon never deep-sleeps (so that it can print on
// time), and its polling backs off to every 10 ms while nothing needs it.
// The period chosen, the largest the runtime takes (2^31-1 ms, 24.8 days),
// counts from the host's boot: on a host up longer than that, the runtime
// prints one "SCHED" line to stderr at start, and one every 24.8 days
// after. A fatal error also prints the scheduler's state with the
// goroutines.
//
// GODEBUG is read once, as the process starts, so Reexec replaces the
// process with itself (same PID, arguments and the rest of the
// environment) under a GODEBUG that adds the setting.
package sysmon

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// Setting is the GODEBUG setting that keeps sysmon from deep sleep.
const Setting = "schedtrace=2147483647"

// Env returns environ (KEY=VALUE entries) with Setting added to GODEBUG,
// and whether it added it. GODEBUG already naming schedtrace, whatever its
// value (schedtrace=0 opts out), leaves environ as it is.
func Env(environ []string) ([]string, bool) {
	out := make([]string, 0, len(environ)+1)
	found := false
	for _, kv := range environ {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			out = append(out, kv)
			continue
		}
		if found {
			continue // a duplicate: getenv reads the first
		}
		found = true
		for s := range strings.SplitSeq(v, ",") {
			if strings.HasPrefix(strings.TrimSpace(s), "schedtrace=") {
				return environ, false
			}
		}
		if v == "" {
			out = append(out, "GODEBUG="+Setting)
		} else {
			out = append(out, "GODEBUG="+v+","+Setting)
		}
	}
	if !found {
		out = append(out, "GODEBUG="+Setting)
	}
	return out, true
}

// Reexec replaces the process with its own executable, arguments and
// environment, GODEBUG carrying Setting (see Env). When GODEBUG already
// names schedtrace it returns nil at once, as it does in the process it
// started; it returns an error only when it could not replace the
// process, which then goes on as it was. Call it first thing in main,
// before any goroutine or file of the program's own.
func Reexec() error {
	env, changed := Env(os.Environ())
	if !changed {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("sysmon: find own executable: %w", err)
	}
	if err := syscall.Exec(exe, os.Args, env); err != nil {
		return fmt.Errorf("sysmon: re-execute %s: %w", exe, err)
	}
	return nil // not reached: Exec does not return on success
}
