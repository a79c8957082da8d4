package artifactfs_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/services/tasks/internal/artifactfs"
)

func TestWrite_refusesNamesLeavingTheTaskFolder(t *testing.T) {
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
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			fs, err := artifactfs.New(data)
			if err != nil {
				t.Fatal(err)
			}
			_, err = fs.Write("task", tc.relPath, tc.fileName, strings.NewReader("x"), 10)
			if !errors.Is(err, artifactfs.ErrBadName) {
				t.Errorf("Write(%q, %q) = %v, want ErrBadName", tc.relPath, tc.fileName, err)
			}
			var files []string
			_ = filepath.WalkDir(data, func(p string, d os.DirEntry, _ error) error {
				if !d.IsDir() {
					files = append(files, p)
				}
				return nil
			})
			if len(files) != 0 {
				t.Errorf("Write(%q, %q) left files %v", tc.relPath, tc.fileName, files)
			}
		})
	}
}

func TestWrite_storesAndOpens(t *testing.T) {
	data := t.TempDir()
	fs, err := artifactfs.New(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"", ".", "python/code/"} {
		n, err := fs.Write("task", rel, "main.py", strings.NewReader("print(1)"), 100)
		if err != nil || n != 8 {
			t.Fatalf("Write(%q) = %d, %v; want 8, nil", rel, n, err)
		}
		clean, _ := artifactfs.CleanRelativePath(rel)
		f, err := fs.Open("task", clean, "main.py")
		if err != nil {
			t.Fatalf("Open(%q): %v", clean, err)
		}
		got, _ := io.ReadAll(f)
		f.Close()
		if string(got) != "print(1)" {
			t.Errorf("Open(%q) read %q, want print(1)", clean, got)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "artifacts", "task", "python", "code", "main.py")); err != nil {
		t.Errorf("file not under the task folder: %v", err)
	}
}

func TestWrite_refusesOversizeAndLeavesNothing(t *testing.T) {
	data := t.TempDir()
	fs, err := artifactfs.New(data)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fs.Write("task", "", "big", bytes.NewReader(make([]byte, 11)), 10)
	if !errors.Is(err, artifactfs.ErrTooLarge) {
		t.Fatalf("Write(11 bytes, limit 10) = %v, want ErrTooLarge", err)
	}
	entries, _ := os.ReadDir(filepath.Join(data, "artifacts", "task"))
	if len(entries) != 0 {
		t.Errorf("oversized write left %d entries", len(entries))
	}
	if n, err := fs.Write("task", "", "exact", bytes.NewReader(make([]byte, 10)), 10); err != nil || n != 10 {
		t.Errorf("Write(10 bytes, limit 10) = %d, %v; want 10, nil", n, err)
	}
}
