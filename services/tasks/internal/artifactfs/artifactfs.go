// Package artifactfs keeps artifact bytes as files named by artifact id:
// <data>/artifacts/<task_id>/<artifact_id>.
//
// A write lands in a temporary file in the task's folder, is fsynced, renamed
// into place, and the directories it touched are fsynced, all before Write
// returns: metadata committed afterwards never points at bytes a crash could
// lose. An artifact's file name and relative path are metadata only, so two
// artifacts with the same name keep their own bytes; the names are still
// checked (CleanFileName, CleanRelativePath) so that a client writing them
// out as a workspace cannot be sent outside the task's folder (no "..",
// absolute paths, backslashes, NUL, control or bidirectional control
// characters, drive letters).
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

	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// Errors returned by Write and Open; callers match them with errors.Is.
var (
	// ErrBadName reports a file name or relative path that is not allowed.
	ErrBadName = errors.New("bad artifact name")
	// ErrTooLarge reports content over the size limit.
	ErrTooLarge = store.ErrTooLarge
)

// FS is the artifact folder of a data directory: the bbolt deployment's
// store.Blobs.
type FS struct {
	root string
	// sync makes a file's or a directory's data durable; tests replace it
	// to count calls.
	sync func(*os.File) error
}

// New returns the FS rooted at <dataDir>/artifacts, creating it.
func New(dataDir string) (*FS, error) {
	root := filepath.Join(dataDir, "artifacts")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("artifact directory %s is unusable: %w", root, err)
	}
	return &FS{root: root, sync: (*os.File).Sync}, nil
}

var _ store.Blobs = (*FS)(nil)

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
		// Bidirectional controls (U+202E and kin) make "gpj.\u202eexe" read
		// as "exe.jpg": refused like other control characters.
		if r == '\\' || r == ':' || r == 0 || unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
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
// form (segments joined by "/", no trailing slash). "" is the task's root
// (the field left unset); "." and "./" are refused, as every "." segment.
func CleanRelativePath(p string) (string, error) {
	if p == "" {
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

// checkID checks a server-made task or artifact id: one plain segment.
func checkID(what, id string) error {
	if err := checkSegment(id); err != nil || strings.ContainsAny(id, "/.") {
		return fmt.Errorf("%w: %s id %q", ErrBadName, what, id)
	}
	return nil
}

// path returns the task's folder and the artifact's file in it.
func (f *FS) path(taskID, artifactID string) (dir, full string, err error) {
	if err := checkID("task", taskID); err != nil {
		return "", "", err
	}
	if err := checkID("artifact", artifactID); err != nil {
		return "", "", err
	}
	dir = filepath.Join(f.root, taskID)
	return dir, filepath.Join(dir, artifactID), nil
}

// Write stores r's bytes (at most limit of them, else ErrTooLarge) as the
// bytes of the task's artifact artifactID, durably, and returns their size.
// The artifact's file name and relative path are metadata the caller checks
// (CleanFileName, CleanRelativePath) and stores; they play no part here.
func (f *FS) Write(taskID, artifactID string, r io.Reader, limit int64) (int64, error) {
	dir, full, err := f.path(taskID, artifactID)
	if err != nil {
		return 0, err
	}
	created := false
	if err := os.Mkdir(dir, 0o700); err == nil {
		created = true
	} else if !errors.Is(err, os.ErrExist) {
		return 0, fmt.Errorf("make artifact directory: %w", err)
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
	if err := f.sync(tmp); err != nil {
		return 0, fmt.Errorf("sync artifact: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return 0, fmt.Errorf("close artifact: %w", err)
	}
	if err := os.Rename(tmp.Name(), full); err != nil {
		return 0, fmt.Errorf("rename artifact into place: %w", err)
	}
	committed = true
	// The rename, and the task's folder if it is new, must reach the disk
	// too.
	dirs := []string{dir}
	if created {
		dirs = append(dirs, f.root)
	}
	for _, d := range dirs {
		if err := f.syncDir(d); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func (f *FS) syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open artifact directory: %w", err)
	}
	defer d.Close()
	if err := f.sync(d); err != nil {
		return fmt.Errorf("sync artifact directory: %w", err)
	}
	return nil
}

// Open opens the bytes of the task's artifact artifactID for reading.
func (f *FS) Open(taskID, artifactID string) (io.ReadSeekCloser, error) {
	_, full, err := f.path(taskID, artifactID)
	if err != nil {
		return nil, err
	}
	file, err := os.Open(full)
	if err != nil {
		return nil, err // not a nil *os.File in an interface
	}
	return file, nil
}

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
