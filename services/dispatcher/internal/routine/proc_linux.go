package routine

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// supported: the worker processes' limits are Linux's.
func supported() error { return nil }

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

// limitCPU sets this worker's CPU time limit, in seconds: past soft the
// kernel sends SIGXCPU (every second), at hard SIGKILL. A process may move
// its soft limit up to its hard one, never its hard one up.
func limitCPU(soft, hard uint64) error {
	if err := syscall.Setrlimit(syscall.RLIMIT_CPU, &syscall.Rlimit{Cur: soft, Max: hard}); err != nil {
		return fmt.Errorf("setrlimit RLIMIT_CPU: %w", err)
	}
	return nil
}

// clockProcessCPUTime is CLOCK_PROCESS_CPUTIME_ID.
const clockProcessCPUTime = 2

// cpuUsed is the CPU time this process has used, user and system: the
// clock RLIMIT_CPU is checked against. A worker reads it after every run;
// once the CPU limit is armed (limitCPU) the kernel keeps the process's
// total in counters it reads directly, where getrusage(2) walked every
// thread and scaled the sum on each read.
func cpuUsed() time.Duration {
	var ts syscall.Timespec
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockProcessCPUTime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}

// exitOnCPULimit makes SIGXCPU (the soft CPU limit, armCPU) end the
// worker, saying why on stderr. The Go runtime ignores SIGXCPU otherwise.
func exitOnCPULimit() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGXCPU)
	go func() {
		<-c
		fmt.Fprintln(os.Stderr, "routine worker: "+cpuDeath)
		os.Exit(3)
	}()
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

// workerPipes returns the worker's stdin and stdout as blocking pipes read
// and written with raw system calls, which the Go scheduler does not see.
// A worker runs one call at a time on its one P (GOMAXPROCS=1): through
// os.File, every read that waits for the next call lets sysmon retake the
// P and hand it to a fresh thread, and every read or write after an idle
// spell wakes sysmon, costing more CPU per call than the routine itself.
// With raw calls the worker's thread sleeps in read(2) holding its P, and
// the kernel wakes it straight into the next call. Nothing else in the
// worker needs the P while it waits: its only goroutine is waiting.
func workerPipes() (in, out io.ReadWriter, err error) {
	for _, fd := range []int{0, 1} {
		if err := syscall.SetNonblock(fd, false); err != nil {
			return nil, nil, fmt.Errorf("blocking fd %d: %w", fd, err)
		}
	}
	return rawFD(0), rawFD(1), nil
}

// rawFD is a blocking file descriptor used through raw system calls.
type rawFD int

func (fd rawFD) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	for {
		n, _, errno := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		switch {
		case errno == syscall.EINTR:
			continue
		case errno != 0:
			return 0, errno
		case n == 0:
			return 0, io.EOF
		}
		return int(n), nil
	}
}

func (fd rawFD) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[done])), uintptr(len(b)-done))
		switch {
		case errno == syscall.EINTR:
			continue
		case errno != 0:
			return done, errno
		}
		done += int(n)
	}
	return done, nil
}
