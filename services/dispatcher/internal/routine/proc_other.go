//go:build !linux

package routine

import (
	"errors"
	"io"
	"os"
	"runtime"
	"syscall"
	"time"
)

// errUnsupported: the boundary rests on Linux's RLIMIT_AS, RLIMIT_CPU and
// Pdeathsig, so off Linux the pool starts no workers and runs nothing
// (running routines unbounded in process would not be safe).
var errUnsupported = errors.New("routines run in worker processes that need Linux (RLIMIT_AS, RLIMIT_CPU, Pdeathsig); this is " + runtime.GOOS + ": run the dispatcher on Linux, for example in its container image")

func supported() error { return errUnsupported }

func limitSelf(int64) error { return errUnsupported }

func procAttr() *syscall.SysProcAttr { return nil }

func peakRSS(*os.ProcessState) int64 { return 0 }

func workerPipes() (in, out io.ReadWriter, err error) { return os.Stdin, os.Stdout, nil }

func limitCPU(uint64, uint64) error { return errors.New("routine workers need Linux (RLIMIT_CPU)") }

func cpuUsed() time.Duration { return 0 }

func exitOnCPULimit() {}
