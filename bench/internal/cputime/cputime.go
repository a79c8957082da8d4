// Package cputime reads, from /proc, the CPU time processes on this Linux
// machine have used: what the benchmarks divide by the requests they made.
package cputime

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// tick is one clock tick of /proc/<pid>/stat: USER_HZ is 100 on Linux.
const tick = 10 * time.Millisecond

// Tree is the user and system CPU time used so far by pid and its live
// children (0 where there is none).
func Tree(pid int) time.Duration {
	var total time.Duration
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		fields := stat(f)
		if len(fields) < 13 {
			continue
		}
		self, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		ppid, _ := strconv.Atoi(fields[1])
		if self != pid && ppid != pid {
			continue
		}
		utime, _ := strconv.ParseInt(fields[11], 10, 64)
		stime, _ := strconv.ParseInt(fields[12], 10, 64)
		total += time.Duration(utime+stime) * tick
	}
	return total
}

// Parent is pid's parent process id, or 0.
func Parent(pid int) int {
	fields := stat(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// stat returns the fields of a /proc/<pid>/stat file after the command
// name (which ends at the last ')'): state, ppid, …, utime (index 11),
// stime (12).
func stat(file string) []string {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// Self is the user and system CPU time this process has used so far.
func Self() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
