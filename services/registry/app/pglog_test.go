package app_test

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/parleyhq/parley/services/registry/app"
	"github.com/parleyhq/parley/services/registry/config"
)

// syncBuffer is a bytes.Buffer safe for the background migration's logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestNew_unreachableDatabaseWarnsOnTheServiceLogger: a registry whose
// PostgreSQL does not answer starts not ready, and says so on the logger
// it was given (JSON, tagged), not on the process's default logger.
func TestNew_unreachableDatabaseWarnsOnTheServiceLogger(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing answers there now
	cfg, err := config.Load([]string{"--data", t.TempDir(), "--database-url", "postgres://postgres@" + addr + "/postgres?sslmode=disable"}, func(string) string { return "" })
	if err != nil {
		t.Fatalf("config.Load error = %v", err)
	}
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil)).With("service", "registry")
	a, err := app.New(cfg, logger, app.Peers{})
	if err != nil {
		t.Fatalf("app.New(unreachable database) error = %v, want a registry that starts not ready", err)
	}
	// The warning is logged before the first retry; Close waits for the
	// retrying goroutine to end.
	a.Close()
	if got := logs.String(); !strings.Contains(got, "the database does not answer") || !strings.Contains(got, `"service":"registry"`) {
		t.Errorf("service log = %q, want the database warning tagged service=registry", got)
	}
}
