package boltstore_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

// --dispatcher-journal may be switched at any restart: what a run without
// the journal wrote is still there when the journal comes back (a journal
// left from an earlier run with it must not take the file back to that
// run's last checkpoint), and what a run with it wrote is there without it.
// Opened without the journal, the store recovers through the journal left
// and removes it.
func TestOpenWith_journalSwitchedOffAndOnKeepsEveryWrite(t *testing.T) {
	dir := t.TempDir()
	const parent = "clients/c/agents/a"
	want := 0
	run := func(opts boltstore.Options, writes int) {
		t.Helper()
		s, err := boltstore.OpenWith(dir, time.Second, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}()
		journal := filepath.Join(dir, boltstore.FileName+boltdb.JournalSuffix)
		if _, err := os.Stat(journal); (err == nil) != (opts.Journal != nil) {
			t.Fatalf("OpenWith(journal %v): stat %s = %v", opts.Journal != nil, journal, err)
		}
		if got, err := s.ListTools(t.Context(), parent); err != nil || len(got) != want {
			t.Fatalf("OpenWith(journal %v): ListTools = %d tools, %v; want %d", opts.Journal != nil, len(got), err, want)
		}
		// Large values, so that pages are freed and reused.
		desc := strings.Repeat("x", 2000)
		for range writes {
			name := fmt.Sprintf("%s/tools/t%04d", parent, want)
			if _, err := s.SetTool(t.Context(), &dispatcherv1.Tool{Name: name, Description: desc}, time.Now()); err != nil {
				t.Fatal(err)
			}
			want++
		}
	}
	on, off := boltstore.Options{Journal: &boltdb.JournalOptions{}}, boltstore.Options{}
	run(on, 50)
	run(off, 200)
	run(on, 50)
	run(off, 0)
	run(on, 0)
}
