//go:build !linux

package routine

import (
	"errors"
	"io"
	"os"
	"syscall"
	"time"
)

// limitSelf is not supported off Linux: the pool refuses to start workers.
func limitSelf(int64) error {
	return errors.New("routine workers need Linux (RLIMIT_AS)")
}

func procAttr() *syscall.SysProcAttr { return nil }

func peakRSS(*os.ProcessState) int64 { return 0 }

func workerPipes() (in, out io.ReadWriter, err error) { return os.Stdin, os.Stdout, nil }

func limitCPU(uint64, uint64) error { return errors.New("routine workers need Linux (RLIMIT_CPU)") }

func cpuUsed() time.Duration { return 0 }

func exitOnCPULimit() {}
