package app_test

import (
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/dispatcher/app"
	"github.com/parleyhq/parley/services/dispatcher/config"
)

// loopFrames are the functions on the stacks of the loops Register starts
// on either backend: the built-in protocols' registration (retrying, as
// the fake registry does not implement it), the conversation sweep, the
// deadlines scheduler and the notification relay.
var loopFrames = []string{
	"app.(*App).registerServiceProtocols(",
	"pgdb.Tick(",
	"deadline.(*Scheduler).Run(",
	"notify.(*Relay).Run(",
}

// Close stops the loops Register starts and waits for them, even while
// Register's context lives: the store is closed next, and nothing may
// touch it after that.
func TestClose_stopsAndWaitsForTheBackgroundLoops(t *testing.T) {
	testCloseStopsLoops(t, nil, loopFrames)
}

// On PostgreSQL, Close also stops the listener that wakes this replica
// on the others' changes, and the exclusive sessions the loops hold.
func TestPostgreSQL_closeStopsAndWaitsForTheBackgroundLoops(t *testing.T) {
	url := pgdbtest.Database(t)
	testCloseStopsLoops(t, []string{"--database-url", url},
		append([]string{"pgstore.(*Store).Listen(", "pgdb.(*DB).Exclusive("}, loopFrames...))
}

func testCloseStopsLoops(t *testing.T, args []string, frames []string) {
	regLis := listen(t)
	regSrv := grpc.NewServer()
	registryv1.RegisterRegistryServiceServer(regSrv, fakeRegistry{})
	go func() { _ = regSrv.Serve(regLis) }()
	t.Cleanup(regSrv.Stop)
	regConn, err := grpc.NewClient(regLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { regConn.Close() })

	cfg, err := config.Load(append([]string{"--data", t.TempDir()}, args...), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	a, err := app.New(cfg, logger, app.Peers{Registry: regConn, Negotiator: regConn})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := serve.New(serve.Options{Logger: logger, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	before := make([]int, len(frames))
	for i, f := range frames {
		before[i] = goroutinesIn(f)
	}
	running := func() string {
		var out []string
		for i, f := range frames {
			if n := goroutinesIn(f) - before[i]; n != 0 {
				out = append(out, fmt.Sprintf("%d %s", n, f))
			}
		}
		return strings.Join(out, ", ")
	}
	if err := a.Register(t.Context(), srv); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		all := true
		for i, f := range frames {
			if goroutinesIn(f)-before[i] < 1 {
				all = false
			}
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the loops did not all start; running: %s", running())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if r := running(); r != "" {
		t.Errorf("still running after Close returned: %s; want none", r)
	}
}

// goroutinesIn counts the goroutines with fn on their stack.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), fn)
		}
		buf = make([]byte, 2*len(buf))
	}
}
