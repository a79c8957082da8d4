package routine

import (
	"bufio"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets this test binary serve as the pool's worker, so the tests
// run routines behind the real boundary. Started under a name beginning
// "rogue-" (a symlink, see rogueWorker) it is a worker that breaks the
// protocol instead.
func TestMain(m *testing.M) {
	if IsWorker() {
		if mode, ok := strings.CutPrefix(filepath.Base(os.Args[0]), "rogue-"); ok {
			os.Exit(serveRogue(mode))
		}
		os.Exit(ServeWorker())
	}
	os.Exit(m.Run())
}

// newTestPool is a pool of worker processes closed with the test. The
// limits o leaves zero get the values the tests assume (the dispatcher's
// defaults; NewPoolWith fills in none).
func newTestPool(t testing.TB, o PoolOptions) *Pool {
	t.Helper()
	p := NewPoolWith(testPoolOptions(o))
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// rogueWorker returns the path of this test binary under the name that
// makes it a rogue worker of mode (see serveRogue).
func rogueWorker(t *testing.T, mode string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rogue-"+mode)
	if err := os.Symlink(self, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// slowStart is how long a "slowstart" rogue worker takes to start. The
// tests give calls a fifth of it as their budget: long enough that a
// loaded machine's scheduling alone does not use it up (at 500 ms, a
// 100 ms budget failed under a load average of 17 on 2 cores), short
// enough that counting the start against it fails them.
const slowStart = 2 * time.Second

// serveRogue is a worker that says hello and then, in mode "compile",
// answers the first program with a frame announcing 200 MiB, or in mode
// "call" compiles programs (answering that they define reply) and answers
// the first call that way; it then streams zeros until it is killed. In
// mode "slowstart" it is a real worker that takes slowStart to start.
func serveRogue(mode string) int {
	if mode == "slowstart" {
		// A worker slower to start than a run's budget (as a loaded
		// machine under -race makes it): then a real one.
		time.Sleep(slowStart)
		return ServeWorker()
	}
	r, w := bufio.NewReader(os.Stdin), bufio.NewWriter(os.Stdout)
	if writeFrame(w, frameHello) != nil {
		return 1
	}
	for {
		typ, _, err := readFrame(r, maxFrame)
		if err != nil {
			return 1
		}
		if typ == frameProgram && mode != "compile" {
			if writeFrame(w, frameCompiled, []byte("reply"), []byte("reply")) != nil {
				return 1
			}
			continue
		}
		hdr := binary.LittleEndian.AppendUint32(nil, 200<<20)
		_, _ = w.Write(append(hdr, frameDone))
		zeros := make([]byte, 64<<10)
		for {
			if _, err := w.Write(zeros); err != nil {
				return 1
			}
		}
	}
}

// testPoolOptions is o with its zero limits set to the values the tests
// assume.
func testPoolOptions(o PoolOptions) PoolOptions {
	if o.MemoryBytes == 0 {
		o.MemoryBytes = 256 << 20
	}
	if o.KillMargin == 0 {
		o.KillMargin = killMargin
	}
	if o.WorkerCPU == 0 {
		o.WorkerCPU = 10 * time.Minute
	}
	return o
}

// testLimits returns l with every budget it leaves zero set to the value
// the tests assume (the dispatcher's defaults): Compile fills in none. A
// nil Pool becomes InProcessForTests(): the guards' tests run in process.
func testLimits(l Limits) Limits {
	if l.Pool == nil {
		l.Pool = InProcessForTests()
	}
	if l.MaxSteps == 0 {
		l.MaxSteps = 1_000_000
	}
	if l.Timeout == 0 {
		l.Timeout = time.Second
	}
	if l.MaxOutputBytes == 0 {
		l.MaxOutputBytes = 64 << 10
	}
	if l.MaxToolCalls == 0 {
		l.MaxToolCalls = 100
	}
	if l.MaxAllocBytes == 0 {
		l.MaxAllocBytes = 64 << 20
	}
	return l
}
