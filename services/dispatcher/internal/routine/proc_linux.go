package routine

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// limitSelf caps this worker's address space at what it has mapped now
// plus limit: the Go runtime reserves most of its address space at start,
// so what routines can add is about limit. Past it allocation fails and
// the runtime dies ("out of memory"), which the pool reports as the
// memory kind. Core dumps are off.
func limitSelf(limit int64) error {
	vm, err := vmSize()
	if err != nil {
		return err
	}
	if raceEnabled {
		limit *= 4 // the race detector's shadow memory
	}
	as := uint64(vm + limit)
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: as, Max: as}); err != nil {
		return fmt.Errorf("setrlimit RLIMIT_AS: %w", err)
	}
	return syscall.Setrlimit(syscall.RLIMIT_CORE, &syscall.Rlimit{})
}

// vmSize is this process's mapped address space, in bytes.
func vmSize() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmSize:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmSize in /proc/self/status")
}

// procAttr kills a worker when the server dies.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// peakRSS is the most memory a reaped worker held, in bytes.
func peakRSS(ps *os.ProcessState) int64 {
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss << 10
	}
	return 0
}
