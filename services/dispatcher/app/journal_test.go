package app_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// --dispatcher-journal (on by default) makes dispatcher.db's commits go
// through dispatcher.db-journal; off, bbolt syncs each commit itself, two
// fdatasyncs per commit, and there is no journal file.
func TestDispatcherJournal_flagTurnsTheJournalOnAndOff(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		journal bool
	}{
		{"default", nil, true},
		{"on", []string{"--dispatcher-journal"}, true},
		{"off", []string{"--dispatcher-journal=false"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			e := startDispatcherApp(t, append([]string{"--data", dir}, tc.args...)...)
			send(t, e.app, "m1", echo)
			path := filepath.Join(dir, "dispatcher.db-journal")
			fi, err := os.Stat(path)
			switch {
			case tc.journal && err != nil:
				t.Errorf("after a write: %v, want the journal", err)
			case tc.journal && fi.Size() == 0:
				t.Errorf("after a write: %s is empty, want the journal", path)
			case !tc.journal && !errors.Is(err, fs.ErrNotExist):
				t.Errorf("after a write with the journal off: stat %s = %v, want it absent", path, err)
			}
		})
	}
}
