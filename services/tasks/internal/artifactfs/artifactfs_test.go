package artifactfs_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/services/tasks/internal/artifactfs"
	"github.com/parleyhq/parley/services/tasks/internal/store"
	"github.com/parleyhq/parley/services/tasks/internal/store/storetest"
)

func TestCleanNames_refuseNamesLeavingTheTaskFolder(t *testing.T) {
	tests := []struct {
		name, relPath, fileName string
	}{
		{"dotdot path", "..", "f"},
		{"dotdot inside path", "a/../../b", "f"},
		{"absolute path", "/etc", "f"},
		{"backslash path", `a\..\..`, "f"},
		{"NUL in path", "a\x00b", "f"},
		{"drive letter", "C:", "f"},
		{"empty segment", "a//b", "f"},
		{"dot segment", "a/./b", "f"},
		{"dotdot file", "", ".."},
		{"dot file", "", "."},
		{"slash in file", "", "a/b"},
		{"backslash file", "", `..\x`},
		{"NUL in file", "", "f\x00"},
		{"control char", "", "f\n"},
		{"empty file", "", ""},
		{"long file", "", strings.Repeat("x", 256)},
		{"invalid UTF-8", "", "\xff"},
		{"dot path", ".", "f"},
		{"dot slash path", "./", "f"},
		{"right-to-left override in file", "", "gpj.\u202eexe"},
		{"right-to-left override in path", "a\u202e", "f"},
		{"left-to-right isolate", "", "f\u2066x"},
		{"right-to-left mark", "", "f\u200fx"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, errPath := artifactfs.CleanRelativePath(tc.relPath)
			_, errFile := artifactfs.CleanFileName(tc.fileName)
			if err := errors.Join(errPath, errFile); !errors.Is(err, artifactfs.ErrBadName) {
				t.Errorf("Clean(%q, %q) = %v, want ErrBadName", tc.relPath, tc.fileName, err)
			}
		})
	}
}

func TestCleanRelativePath_canonical(t *testing.T) {
	for in, want := range map[string]string{"": "", "python/code/": "python/code", "a": "a"} {
		if got, err := artifactfs.CleanRelativePath(in); err != nil || got != want {
			t.Errorf("CleanRelativePath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestWrite_refusesBadIDsAndWritesNothing(t *testing.T) {
	for _, ids := range [][2]string{{"..", "a"}, {"t", ".."}, {"t", "a/b"}, {"a/b", "x"}, {"", "x"}, {"t", ""}, {"t", ".hidden"}} {
		data := t.TempDir()
		fs, err := artifactfs.New(data)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fs.Write(ids[0], ids[1], strings.NewReader("x"), 10); !errors.Is(err, artifactfs.ErrBadName) {
			t.Errorf("Write(%q, %q) = %v, want ErrBadName", ids[0], ids[1], err)
		}
		var files []string
		_ = filepath.WalkDir(data, func(p string, d os.DirEntry, _ error) error {
			if !d.IsDir() {
				files = append(files, p)
			}
			return nil
		})
		if len(files) != 0 {
			t.Errorf("Write(%q, %q) left files %v", ids[0], ids[1], files)
		}
	}
}

func TestWrite_storesEachArtifactByID(t *testing.T) {
	data := t.TempDir()
	fs, err := artifactfs.New(data)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a1": "first", "a2": "second", "a3": "third"}
	for id, content := range want {
		n, err := fs.Write("task", id, strings.NewReader(content), 100)
		if err != nil || n != int64(len(content)) {
			t.Fatalf("Write(%q) = %d, %v; want %d, nil", id, n, err, len(content))
		}
	}
	for id, content := range want {
		f, err := fs.Open("task", id)
		if err != nil {
			t.Fatalf("Open(%q): %v", id, err)
		}
		got, _ := io.ReadAll(f)
		f.Close()
		if string(got) != content {
			t.Errorf("Open(%q) read %q, want %q", id, got, content)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "artifacts", "task", "a1")); err != nil {
		t.Errorf("file not stored under its id: %v", err)
	}
	if _, err := fs.Open("task", "missing"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) = %v, want ErrNotExist", err)
	}
}

func TestWrite_refusesOversizeAndLeavesNothing(t *testing.T) {
	data := t.TempDir()
	fs, err := artifactfs.New(data)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fs.Write("task", "big", bytes.NewReader(make([]byte, 11)), 10)
	if !errors.Is(err, artifactfs.ErrTooLarge) {
		t.Fatalf("Write(11 bytes, limit 10) = %v, want ErrTooLarge", err)
	}
	entries, _ := os.ReadDir(filepath.Join(data, "artifacts", "task"))
	if len(entries) != 0 {
		t.Errorf("oversized write left %d entries", len(entries))
	}
	if n, err := fs.Write("task", "exact", bytes.NewReader(make([]byte, 10)), 10); err != nil || n != 10 {
		t.Errorf("Write(10 bytes, limit 10) = %d, %v; want 10, nil", n, err)
	}
}

// The fsync seam: a kill -9 test cannot see a missing fsync (the page cache
// survives the process), so this checks that Write syncs, before it returns,
// the file's bytes, the directory entry of its rename, and the parent of a
// task folder it created, and that a failing fsync fails the write.
func TestWrite_syncsFileAndDirectoriesBeforeReturning(t *testing.T) {
	data := t.TempDir()
	fs, err := artifactfs.New(data)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(data, "artifacts")
	var synced []string
	fs.SetSync(func(f *os.File) error {
		synced = append(synced, f.Name())
		return f.Sync()
	})
	tests := []struct {
		name, task, id string
		want           func(tmp string) []string
	}{
		{"new task folder", "t1", "a1", func(tmp string) []string {
			return []string{tmp, filepath.Join(root, "t1"), root}
		}},
		{"existing task folder", "t1", "a2", func(tmp string) []string {
			return []string{tmp, filepath.Join(root, "t1")}
		}},
	}
	for _, tc := range tests {
		synced = nil
		if _, err := fs.Write(tc.task, tc.id, strings.NewReader("x"), 10); err != nil {
			t.Fatalf("%s: Write: %v", tc.name, err)
		}
		if len(synced) == 0 || !strings.HasPrefix(filepath.Base(synced[0]), ".upload-") {
			t.Fatalf("%s: synced %v; want the temporary file first", tc.name, synced)
		}
		want := tc.want(synced[0])
		if strings.Join(synced, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: synced %v, want %v", tc.name, synced, want)
		}
	}
	for i := range 3 {
		calls := 0
		fs.SetSync(func(f *os.File) error {
			calls++
			if calls == i+1 {
				return errors.New("disk on fire")
			}
			return f.Sync()
		})
		if _, err := fs.Write(fmt.Sprint("new", i), "a", strings.NewReader("x"), 10); err == nil {
			t.Errorf("Write with fsync %d failing = nil error, want the failure", i+1)
		}
	}
}

func TestConformance(t *testing.T) {
	storetest.RunBlobs(t, func(t *testing.T) store.Blobs {
		fs, err := artifactfs.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return fs
	})
}
