// Package artifactfs keeps artifact bytes as files under
// <data>/artifacts/<task_id>/<relative_path>/<file_name>.
//
// A write lands in a temporary file in the task's folder, is fsynced, renamed
// into place, and the directories it touched are fsynced, all before Write
// returns: metadata committed afterwards never points at bytes a crash could
// lose. Names are checked so that nothing escapes the task's folder (no "..",
// absolute paths, backslashes, NUL or control characters, drive letters).
// Writing the same path twice replaces the file, as in a workspace.
package artifactfs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Errors returned by Write and Open; callers match them with errors.Is.
var (
	// ErrBadName reports a file name or relative path that is not allowed.
	ErrBadName = errors.New("bad artifact name")
	// ErrTooLarge reports content over the size limit.
	ErrTooLarge = errors.New("artifact too large")
)

// FS is the artifact folder of a data directory.
type FS struct {
	root string
}

// New returns the FS rooted at <dataDir>/artifacts, creating it.
func New(dataDir string) (*FS, error) {
	root := filepath.Join(dataDir, "artifacts")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("artifact directory %s is unusable: %w", root, err)
	}
	return &FS{root: root}, nil
}

const maxNameBytes = 255

func checkSegment(s string) error {
	switch {
	case s == "":
		return errors.New("has an empty segment")
	case s == "." || s == "..":
		return fmt.Errorf("segment %q is not allowed", s)
	case len(s) > maxNameBytes:
		return fmt.Errorf("segment is longer than %d bytes", maxNameBytes)
	case !utf8.ValidString(s):
		return errors.New("is not valid UTF-8")
	}
	for _, r := range s {
		if r == '\\' || r == ':' || r == 0 || unicode.IsControl(r) {
			return fmt.Errorf("contains the character %q", r)
		}
	}
	return nil
}

// CleanFileName checks a file name: one path segment.
func CleanFileName(name string) (string, error) {
	if strings.Contains(name, "/") {
		return "", fmt.Errorf("%w: file name %q contains a slash", ErrBadName, name)
	}
	if err := checkSegment(name); err != nil {
		return "", fmt.Errorf("%w: file name %w", ErrBadName, err)
	}
	return name, nil
}

// CleanRelativePath checks a relative directory and returns it in canonical
// form (segments joined by "/", no trailing slash; "" for the task's root).
// "." and "./" mean the root.
func CleanRelativePath(p string) (string, error) {
	if p == "" || p == "." || p == "./" {
		return "", nil
	}
	if strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%w: relative_path %q is absolute", ErrBadName, p)
	}
	if len(p) > 1024 {
		return "", fmt.Errorf("%w: relative_path is longer than 1024 bytes", ErrBadName)
	}
	segs := strings.Split(strings.TrimSuffix(p, "/"), "/")
	for _, s := range segs {
		if err := checkSegment(s); err != nil {
			return "", fmt.Errorf("%w: relative_path %w", ErrBadName, err)
		}
	}
	return strings.Join(segs, "/"), nil
}

// taskDir returns the task's folder; taskID is a server-made UUID, checked
// anyway.
func (f *FS) taskDir(taskID string) (string, error) {
	if err := checkSegment(taskID); err != nil || strings.Contains(taskID, "/") {
		return "", fmt.Errorf("%w: task id %q", ErrBadName, taskID)
	}
	return filepath.Join(f.root, taskID), nil
}

// path returns the file's path, checking names and that it stays inside the
// task's folder.
func (f *FS) path(taskID, relPath, fileName string) (dir, full string, err error) {
	base, err := f.taskDir(taskID)
	if err != nil {
		return "", "", err
	}
	if _, err := CleanFileName(fileName); err != nil {
		return "", "", err
	}
	rel, err := CleanRelativePath(relPath)
	if err != nil {
		return "", "", err
	}
	dir = filepath.Join(base, filepath.FromSlash(rel))
	full = filepath.Join(dir, fileName)
	if r, err := filepath.Rel(base, full); err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
		return "", "", fmt.Errorf("%w: %q escapes the task's folder", ErrBadName, rel+"/"+fileName)
	}
	return dir, full, nil
}

// Write stores r's bytes (at most limit of them, else ErrTooLarge) as the
// task's file relPath/fileName, durably, and returns its size.
func (f *FS) Write(taskID, relPath, fileName string, r io.Reader, limit int64) (int64, error) {
	dir, full, err := f.path(taskID, relPath, fileName)
	if err != nil {
		return 0, err
	}
	base, _ := f.taskDir(taskID)
	created, err := mkdirAll(f.root, base, dir)
	if err != nil {
		return 0, err
	}
	tmp, err := os.CreateTemp(dir, ".upload-"+randomHex()+"-*")
	if err != nil {
		return 0, fmt.Errorf("create temporary artifact file: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	n, err := io.Copy(tmp, io.LimitReader(r, limit+1))
	if err != nil {
		return 0, fmt.Errorf("write artifact: %w", err)
	}
	if n > limit {
		return 0, fmt.Errorf("%w: over %d bytes", ErrTooLarge, limit)
	}
	if err := tmp.Sync(); err != nil {
		return 0, fmt.Errorf("sync artifact: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return 0, fmt.Errorf("close artifact: %w", err)
	}
	if err := os.Rename(tmp.Name(), full); err != nil {
		return 0, fmt.Errorf("rename artifact into place: %w", err)
	}
	committed = true
	// The rename, and any directories made above, must reach the disk too.
	for _, d := range append([]string{dir}, created...) {
		if err := syncDir(d); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// mkdirAll makes dir (inside root) and returns the parents of every
// directory it created, which need an fsync to make the new entries durable.
func mkdirAll(root, base, dir string) ([]string, error) {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("artifact directory: %w", err)
		}
		missing = append(missing, d)
		if d == base || d == root {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("make artifact directory: %w", err)
	}
	var parents []string
	for _, d := range missing {
		parents = append(parents, filepath.Dir(d))
	}
	return parents, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open artifact directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync artifact directory: %w", err)
	}
	return nil
}

// Open opens the task's file relPath/fileName for reading.
func (f *FS) Open(taskID, relPath, fileName string) (*os.File, error) {
	_, full, err := f.path(taskID, relPath, fileName)
	if err != nil {
		return nil, err
	}
	return os.Open(full)
}

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
